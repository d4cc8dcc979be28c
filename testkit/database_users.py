"""Least privilege for test processes: a MariaDB user per process, with DML on its own service's tables only.

docs/OPERATIONS.md gives the same GRANTs for production. Each process also gets the other service's URL, pointed
at a user that does not exist, so any access across the line fails loudly (1045, access denied) instead of working
by accident through a shared superuser.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from django.db import connections

from credits.models import CreditBalance, DeadLetter, OrderCredit
from outbox.models import TransactionLog
from testkit.processes import DATABASE_URL_VARIABLES, database_url

# Process name (as in tests/reliability/harness.Cluster) -> database alias -> table -> privileges. No DDL: the
# migrations run as another user. The web is not here: it serves both services' APIs and the admin (OPERATIONS.md).
PROCESS_GRANTS: dict[str, dict[str, dict[str, str]]] = {
    # Claims due rows and marks them published or failed.
    "relay": {"default": {TransactionLog._meta.db_table: "SELECT, UPDATE"}},
    # Runs the relay's wake-up task and the sweeper like the relay, and deletes published rows past retention.
    "outbox": {"default": {TransactionLog._meta.db_table: "SELECT, UPDATE, DELETE"}},
    # Awards (balance row, credit row) and records dead letters; never deletes.
    "credits": {
        "credits": {
            CreditBalance._meta.db_table: "SELECT, INSERT, UPDATE",
            OrderCredit._meta.db_table: "SELECT, INSERT",
            DeadLetter._meta.db_table: "SELECT, INSERT, UPDATE",
        }
    },
    # Keeps its schedule in a file and only publishes: no database at all.
    "beat": {},
}
# A user no server knows: the URL a process gets for a database it has no business with.
NO_ACCESS_USER = "cs_no_access"


@dataclass
class ProcessUsers:
    """Create, hand out and drop one MariaDB user per process, on the server behind each database alias."""

    suffix: str = field(default_factory=lambda: secrets.token_hex(4))
    passwords: dict[str, str] = field(default_factory=dict)

    def user(self, process: str) -> str:
        return f"cs_{process}_{self.suffix}"

    def create(self) -> None:
        for process, databases in PROCESS_GRANTS.items():
            password = self.passwords.setdefault(process, secrets.token_hex(12))
            for alias, tables in databases.items():
                name = connections[alias].settings_dict["NAME"]
                with connections[alias].cursor() as cursor:
                    cursor.execute("CREATE USER %s@'%%' IDENTIFIED BY %s", [self.user(process), password])
                    for table, privileges in tables.items():
                        cursor.execute(f"GRANT {privileges} ON `{name}`.`{table}` TO %s@'%%'", [self.user(process)])

    def drop(self) -> None:
        for process, databases in PROCESS_GRANTS.items():
            for alias in databases:
                with connections[alias].cursor() as cursor:
                    cursor.execute("DROP USER IF EXISTS %s@'%%'", [self.user(process)])

    def env(self, process: str) -> dict[str, str]:
        """Return the database URLs of a process: its own user where it has grants, a user that cannot log in else."""
        own = PROCESS_GRANTS[process]
        return {
            variable: database_url(alias, user=self.user(process), password=self.passwords[process])
            if alias in own
            else database_url(alias, user=NO_ACCESS_USER, password=secrets.token_hex(12))
            for alias, variable in DATABASE_URL_VARIABLES.items()
        }

    def cluster_env(self) -> dict[str, dict[str, str]]:
        """Return Cluster.process_env: each process with its own user."""
        return {process: self.env(process) for process in PROCESS_GRANTS}

"""Migrations must be deployable while the old code runs and orders flow (docs/OPERATIONS.md, "Schema changes").

Two checks over every app's migrations, each against the database the app lives in:
- django-migration-linter: nothing the running (older) code would break on: no NOT NULL column without a default,
  no dropped or renamed column or table, no new unique constraint.
- online DDL: a statement altering a hot table (one the order request or the award writes) names its algorithm, so
  MariaDB refuses it rather than silently copying the table under a lock: ALGORITHM=INSTANT, or ALGORITHM=INPLACE
  with LOCK=NONE.
A migration either passes or is listed below with the reason it may not.
"""

import re

import pytest
from django.core.management import call_command
from django.db import connections, router
from django.db.migrations.loader import MigrationLoader
from django_migration_linter import MigrationLinter

# Whole migrations the linter may flag, and why. (app, name) -> reason.
LINTER_ALLOWED = {
    ("credits", "0003_dead_letter_trace_context"): (
        "adds two NOT NULL columns whose default Django drops afterwards, so code that did not know them could not "
        "record a dead letter; applied together with that code before deploys overlapped, and that code runs nowhere"
    ),
    ("credits", "0005_order_credit_ordered_at"): (
        "its DROP COLUMN is the reverse SQL only: rolling the migration back removes a column only newer code writes"
    ),
}
# Third-party apps whose whole migration history ships with the package, and why the linter may skip it.
LINTER_EXCLUDED_APPS = {
    "axes": (
        "django-axes' own history, applied in full when the package is installed: its old column drops ran against"
        " tables only axes reads, never while code of ours used them"
    ),
}
# Migrations from before the online-DDL rule. (app, name) -> reason.
ONLINE_DDL_ALLOWED = {
    ("orders", "0002_idempotency_created_at_index"): (
        "before the rule; a plain CREATE INDEX, which MariaDB builds INPLACE without locking writes anyway"
    ),
    ("outbox", "0003_trace_context"): (
        "before the rule; adding a column with a constant default at the end of the table is INSTANT on MariaDB 10.3+"
    ),
}
# Tables an order request or an award writes: a lock on one of them stops orders or credits.
HOT_TABLES = ("orders", "transaction_log", "idempotency_keys", "order_credits", "credit_balances")
ONLINE = re.compile(r"ALGORITHM\s*=\s*(INSTANT|INPLACE\b.*\bLOCK\s*=\s*NONE|NOCOPY\b.*\bLOCK\s*=\s*NONE)", re.I | re.S)
# Changing a column's default is a metadata change on every MariaDB and MySQL 8 storage engine.
METADATA_ONLY = re.compile(r"^ALTER TABLE `\w+` ALTER COLUMN `\w+` (SET DEFAULT .*|DROP DEFAULT);?$", re.I | re.S)


def migrations_by_database() -> dict[str, list[tuple[str, str]]]:
    """Return each database alias and the (app, name) of the migrations that run on it (by the router)."""
    loader = MigrationLoader(None, ignore_no_migrations=True)
    found: dict[str, list[tuple[str, str]]] = {alias: [] for alias in connections}
    for app_label, name in sorted(loader.disk_migrations):
        for alias in connections:
            if router.allow_migrate(alias, app_label):
                found[alias].append((app_label, name))
    return found


@pytest.mark.django_db(databases=["default", "credits"])
@pytest.mark.parametrize("alias", ["default", "credits"])
def test_no_migration_would_break_the_code_still_running(alias, capsys):
    names = migrations_by_database()[alias]
    apps = sorted({app for app, _ in names} - set(LINTER_EXCLUDED_APPS))
    linter = MigrationLinter(
        database=alias,
        include_apps=apps,
        ignore_name=[name for (app, name) in LINTER_ALLOWED if app in apps],
        no_cache=True,
    )
    linter.lint_all_migrations()
    assert not linter.has_errors, capsys.readouterr().out
    # The allowed list names migrations that exist, each needed: an entry nothing matches is stale.
    assert set(LINTER_ALLOWED) <= {name for names in migrations_by_database().values() for name in names}


def statements(alias: str, app: str, name: str) -> list[str]:
    """Return the SQL statements a migration runs on this database (sqlmigrate), comments left out."""
    from io import StringIO

    out = StringIO()
    call_command("sqlmigrate", app, name, database=alias, stdout=out)
    text = "\n".join(line for line in out.getvalue().splitlines() if not line.startswith("--"))
    return [statement.strip() for statement in text.split(";\n") if statement.strip()]


def offline_statements(alias: str, app: str, name: str) -> list[str]:
    """Return the statements of a migration that alter a hot table, existing before it, without naming an online way."""
    found = statements(alias, app, name)
    created = {table for table in HOT_TABLES for s in found if re.match(rf"CREATE TABLE `{table}`", s, re.I)}
    offline = []
    for statement in found:
        match = re.match(
            r"(?:ALTER TABLE|CREATE (?:UNIQUE )?INDEX `\w+` ON|DROP INDEX `\w+` ON) `(\w+)`", statement, re.I
        )
        if match is None or match.group(1) not in HOT_TABLES or match.group(1) in created:
            continue
        if not ONLINE.search(statement) and not METADATA_ONLY.match(statement):
            offline.append(statement)
    return offline


@pytest.mark.django_db(databases=["default", "credits"])
@pytest.mark.parametrize("alias", ["default", "credits"])
def test_every_change_to_a_hot_table_names_an_online_algorithm(alias):
    offline = {
        (app, name): found
        for app, name in migrations_by_database()[alias]
        if (app, name) not in ONLINE_DDL_ALLOWED and (found := offline_statements(alias, app, name))
    }
    assert offline == {}


def test_the_online_ddl_check_tells_online_statements_from_the_rest():
    assert ONLINE.search("ALTER TABLE `orders` ADD COLUMN `x` int NULL, ALGORITHM=INSTANT")
    assert ONLINE.search("ALTER TABLE orders ADD INDEX i (x), ALGORITHM=INPLACE, LOCK=NONE")
    assert not ONLINE.search("ALTER TABLE orders ADD INDEX i (x), ALGORITHM=INPLACE")
    assert not ONLINE.search("ALTER TABLE orders ADD INDEX i (x), ALGORITHM=COPY, LOCK=NONE")
    assert not ONLINE.search("CREATE INDEX `i` ON `orders` (`x`)")
    assert METADATA_ONLY.match("ALTER TABLE `transaction_log` ALTER COLUMN `attempts` SET DEFAULT 0")
    assert not METADATA_ONLY.match("ALTER TABLE `transaction_log` MODIFY `attempts` integer NOT NULL")

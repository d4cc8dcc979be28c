"""Where and how Spark reads and writes the shop's databases over JDBC: a source per service, its URL and options.

The two services keep their own databases, which may sit on different servers (or be one database, on a small
install): a run reads each through its own source, and the report tables are written to the order service's.
"""

from dataclasses import dataclass

from django.conf import settings
from django.db import connections, router

from core.deadlines import NIGHTLY, ROLES
from credits.models import OrderCredit
from orders.models import Order

JDBC_DRIVER = "org.mariadb.jdbc.Driver"


@dataclass(frozen=True)
class JdbcSource:
    """Where and how Spark reads: the JDBC URL (jdbc:mysql://, which MariaDB Connector/J accepts) and options.

    `alias` is the Django database behind the URL, which answers the small planning queries (bounds, counts).
    """

    alias: str
    url: str
    user: str
    password: str
    partitions: int
    fetchsize: int

    def options(self) -> dict[str, str]:
        deadlines = ROLES[NIGHTLY]
        return {
            "url": self.url,
            "driver": JDBC_DRIVER,
            "user": self.user,
            "password": self.password,
            "fetchsize": str(self.fetchsize),
            # Connector/J's deadlines, in milliseconds: the nightly role's (core/deadlines.py), so a silent database
            # fails the run's read instead of hanging it until the run's own time limit.
            "connectTimeout": str(deadlines.connect * 1000),
            "socketTimeout": str(deadlines.read * 1000),
        }


def jdbc_source(alias: str = "default") -> JdbcSource:
    """Return the JDBC coordinates of a Django database (its test database while tests run)."""
    db = connections[alias].settings_dict
    host = db.get("HOST") or "127.0.0.1"
    port = db.get("PORT") or 3306
    return JdbcSource(
        alias=alias,
        # Batched inserts become multi-row INSERTs: a staging table of 640,000 rows fills four times faster.
        url=f"jdbc:mysql://{host}:{port}/{db['NAME']}?rewriteBatchedStatements=true",
        user=db.get("USER") or "root",
        password=db.get("PASSWORD") or "",
        partitions=settings.ANALYTICS_JDBC_PARTITIONS,
        fetchsize=settings.ANALYTICS_JDBC_FETCHSIZE,
    )


@dataclass(frozen=True)
class Sources:
    """The two databases a run reads: the order service's (which also keeps the analytics tables) and the credits
    service's. They may be one database (a small install) or on two servers; the job treats them as two either way.
    """

    orders: JdbcSource
    credits: JdbcSource


def sources() -> Sources:
    """Return the JDBC sources of both services: each the database its app's tables are routed to, or that
    database's replica when ANALYTICS_READ_DATABASES names one.
    """
    replicas = settings.ANALYTICS_READ_DATABASES
    orders, credits = router.db_for_read(Order), router.db_for_read(OrderCredit)
    return Sources(
        orders=jdbc_source(replicas.get(orders, orders)), credits=jdbc_source(replicas.get(credits, credits))
    )

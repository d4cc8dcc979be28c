"""Reading the shop's tables into Spark over JDBC, limited to the reported days plus a look-back on each side.

The two services keep their own databases, which may sit on different servers: orders and transaction_log are read
from the order service's (`default`), order_credits and the dead letters from the credits service's (`credits`).
Each read goes to the one source that holds its table, and the two sides meet only in Spark's joins, never in SQL.

Large reads are partitioned: `partitionColumn` on the id (or created_at for transaction_log, whose id is text)
with bounds from MIN/MAX over the same window, which the created_at indexes answer without a scan. Rows that a
check needs but that fall outside the window (a credit awarded today for a week-old order) are looked up by id
afterwards, so the window only decides speed, never the answer. Every frame is conformed to a fixed schema, so
the transforms see the same types the tests build.
"""

import math
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime

from django.conf import settings
from django.db import connections, router
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from analytics.schemas import (
    CREDITS_SCHEMA,
    DAILY_HISTORY_SCHEMA,
    DEAD_LETTERS_SCHEMA,
    FIRST_ORDERS_SCHEMA,
    LOGS_SCHEMA,
    ORDERS_SCHEMA,
)
from credits.models import DeadLetter, OrderCredit
from orders.models import Order

JDBC_DRIVER = "org.mariadb.jdbc.Driver"
# Ids per IN (...) list in the look-ups; each list is one JDBC partition.
LOOKUP_CHUNK = 1_000
# Rows one JDBC query reads before another partition is worth its connection and task (measured: a day of
# 46,000 orders reads faster as one query than as four on two cores).
ROWS_PER_PARTITION = 200_000

_ORDERS_SQL = "SELECT id, user_id, total, created_at FROM orders"
# foreign_key is text; try_cast (in Spark) turns a non-numeric key into NULL instead of failing the run.
_LOGS_SQL = (
    "SELECT id, foreign_key, status, attempts, created_at, published_at FROM transaction_log WHERE business = 'order'"
)
_CREDITS_SQL = "SELECT id, user_id, order_id, total, created_at, ordered_at FROM order_credits"
_PAYLOAD_ORDER_ID = (
    "CAST(COALESCE(JSON_VALUE(payload, '$.order_id'), JSON_VALUE(payload, '$.message.order_id')) AS SIGNED)"
)


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
        return {
            "url": self.url,
            "driver": JDBC_DRIVER,
            "user": self.user,
            "password": self.password,
            "fetchsize": str(self.fetchsize),
        }


def jdbc_source(alias: str = "default") -> JdbcSource:
    """Return the JDBC coordinates of a Django database (its test database while tests run)."""
    db = connections[alias].settings_dict
    host = db.get("HOST") or "127.0.0.1"
    port = db.get("PORT") or 3306
    return JdbcSource(
        alias=alias,
        # Batched inserts become multi-row INSERTs: the staging table fills 4x faster (measured, 640,000 rows).
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
    """Return the JDBC sources of both services, each the database its app's tables are routed to."""
    return Sources(orders=jdbc_source(router.db_for_read(Order)), credits=jdbc_source(router.db_for_read(OrderCredit)))


@dataclass
class Extracted:
    """The rows a run works on. Window frames cover [start, end); look-ups add rows found outside it."""

    orders: DataFrame
    logs: DataFrame
    credits: DataFrame
    dead_letters: DataFrame
    first_orders: DataFrame
    history: DataFrame
    dead_letters_note: str = ""


def extract_window(spark: SparkSession, sources: Sources, *, start: datetime, end: datetime) -> Extracted:
    """Read orders, outbox rows and credits created in [start, end), and the small side tables.

    The six reads are set up side by side: each asks MariaDB for its bounds and Spark for the query's schema
    (a round trip each), which one after the other cost seconds of a day's run.
    """
    orders, credits = sources.orders, sources.credits
    reads = {
        "orders": lambda: conform_or_empty(
            spark, read_partitioned(spark, orders, sql=_ORDERS_SQL, column="id", start=start, end=end), ORDERS_SCHEMA
        ),
        "logs": lambda: conform_logs(
            spark, read_partitioned(spark, orders, sql=_LOGS_SQL, column="created_at", start=start, end=end)
        ),
        "credits": lambda: conform_or_empty(
            spark,
            read_partitioned(spark, credits, sql=_CREDITS_SQL, column="id", start=start, end=end),
            CREDITS_SCHEMA,
        ),
        "dead_letters": lambda: read_open_dead_letters(spark, credits),
        "first_orders": lambda: read_first_orders(spark, orders, start=start, end=end),
        "history": lambda: read_daily_history(spark, orders),
    }
    with ThreadPoolExecutor(max_workers=len(reads), thread_name_prefix="extract") as pool:
        futures = {name: pool.submit(_in_own_connection, read) for name, read in reads.items()}
        frames = {name: future.result() for name, future in futures.items()}
    dead_letters, note = frames.pop("dead_letters")
    return Extracted(**frames, dead_letters=dead_letters, dead_letters_note=note)


def _in_own_connection(read):
    """Run a read on a worker thread, closing the database connections Django opened for that thread."""
    try:
        return read()
    finally:
        connections.close_all()


def count_orders(source: JdbcSource, *, start: datetime, end: datetime) -> int:
    """Count the orders placed in [start, end) (from the created_at index), to size the run before it starts."""
    with connections[source.alias].cursor() as cursor:
        cursor.execute("SELECT COUNT(*) FROM orders WHERE created_at >= %s AND created_at < %s", [start, end])
        return cursor.fetchone()[0]


def read_partitioned(
    spark: SparkSession, source: JdbcSource, *, sql: str, column: str, start: datetime, end: datetime
) -> DataFrame | None:
    """Read `sql` restricted to created_at in [start, end), split on `column` between its MIN and MAX there.

    The number of partitions grows with the rows in the window, up to ANALYTICS_JDBC_PARTITIONS: a day is one
    query, a month is several running side by side.
    """
    table = _table_of(sql)
    window = f"created_at >= '{_ts(start)}' AND created_at < '{_ts(end)}'"
    with connections[source.alias].cursor() as cursor:
        # Identifiers come from this module's constants; the instants are formatted datetimes.
        cursor.execute(f"SELECT MIN({column}), MAX({column}), COUNT(*) FROM {table} WHERE {window}")  # noqa: S608
        lower, upper, rows = cursor.fetchone()
    if lower is None:
        return None
    partitions = max(1, min(source.partitions, math.ceil(rows / ROWS_PER_PARTITION)))
    glue = " AND " if " WHERE " in sql else " WHERE "
    if isinstance(lower, datetime):
        lower_bound, upper_bound = _ts(lower), _ts(upper)
    else:
        # upperBound is exclusive in the stride arithmetic; +1 keeps the largest id in the last stride's range.
        lower_bound, upper_bound = str(lower), str(upper + 1)
    return (
        spark.read.format("jdbc")
        .options(**source.options())
        .option("dbtable", f"({sql}{glue}{window}) AS src")
        .option("partitionColumn", column)
        .option("lowerBound", lower_bound)
        .option("upperBound", upper_bound)
        .option("numPartitions", str(partitions))
        .load()
    )


def read_orders_by_id(spark: SparkSession, sources: Sources, ids: Iterable[int]) -> DataFrame:
    """Look up orders by id (those a check needs from outside the window), in the order service's database."""
    orders = _read_in(spark, sources.orders, sql=_ORDERS_SQL, column="id", values=ids)
    return conform_or_empty(spark, orders, ORDERS_SCHEMA)


def read_credits_by_order_id(spark: SparkSession, sources: Sources, order_ids: Iterable[int]) -> DataFrame:
    """Look up the credits of these orders, wherever in time they were awarded, in the credits database."""
    credits = _read_in(spark, sources.credits, sql=_CREDITS_SQL, column="order_id", values=order_ids)
    return conform_or_empty(spark, credits, CREDITS_SCHEMA)


def read_logs_by_order_id(spark: SparkSession, sources: Sources, order_ids: Iterable[int]) -> DataFrame:
    """Look up the outbox rows of these orders, wherever in time they were written, in the order service's database."""
    keys = (f"'{int(i)}'" for i in order_ids)
    logs = _read_in(spark, sources.orders, sql=_LOGS_SQL, column="foreign_key", values=keys, quoted=True)
    return conform_logs(spark, logs)


def read_first_orders(spark: SparkSession, source: JdbcSource, *, start: datetime, end: datetime) -> DataFrame:
    """Return each user whose first order ever was placed in [start, end), with that order's id.

    Ids grow with time, so "first order" is MIN(id), which MariaDB answers from the user_id index alone
    (a loose index scan: one probe per user, however long the history).
    """
    with connections[source.alias].cursor() as cursor:
        cursor.execute("SELECT MIN(id) FROM orders WHERE created_at >= %s AND created_at < %s", [start, end])
        (lower,) = cursor.fetchone()
    if lower is None:
        return spark.createDataFrame([], FIRST_ORDERS_SCHEMA)
    sql = (
        "SELECT user_id, MIN(id) AS first_order_id FROM orders "  # noqa: S608
        f"GROUP BY user_id HAVING MIN(id) >= {int(lower)}"
    )
    return conform(_read_query(spark, source, sql), FIRST_ORDERS_SCHEMA)


def read_daily_history(spark: SparkSession, source: JdbcSource) -> DataFrame:
    """Read the daily metrics earlier runs stored (one small row per day), for the trends."""
    columns = ", ".join(field.name for field in DAILY_HISTORY_SCHEMA.fields)
    sql = f"SELECT {columns} FROM analytics_daily_metrics"  # noqa: S608
    return conform(_read_query(spark, source, sql), DAILY_HISTORY_SCHEMA)


def read_open_dead_letters(spark: SparkSession, source: JdbcSource) -> tuple[DataFrame, str]:
    """Read the open dead-lettered credit messages, or none with a note when the credits app has no such table."""
    table = dead_letter_table(source)
    if table is None:
        return spark.createDataFrame([], DEAD_LETTERS_SCHEMA), "no dead-letter table in this database; reported 0"
    name, columns = table
    # Names below come from the database's own catalogue, checked against what this code expects.
    order_id = "order_id" if "order_id" in columns else _PAYLOAD_ORDER_ID
    created = next((c for c in ("created_at", "first_failed_at", "last_failed_at") if c in columns), "NULL")
    sql = (
        f"SELECT id, {order_id} AS order_id, status, {created} AS created_at "  # noqa: S608
        f"FROM {name} WHERE status = 'open'"
    )
    return conform(_read_query(spark, source, sql), DEAD_LETTERS_SCHEMA), ""


def dead_letter_table(source: JdbcSource) -> tuple[str, set[str]] | None:
    """Return the credits consumer's dead-letter table's name and columns if it exists in the source's database."""
    name = DeadLetter._meta.db_table
    connection = connections[source.alias]
    with connection.cursor() as cursor:
        if name not in connection.introspection.table_names(cursor):
            return None
        columns = {column.name for column in connection.introspection.get_table_description(cursor, name)}
    if not {"id", "status"} <= columns or not ({"order_id", "payload"} & columns):
        return None
    return name, columns


def conform(df: DataFrame, schema: StructType) -> DataFrame:
    """Select the schema's columns, cast to its types, whatever types the JDBC dialect chose."""
    return df.select(*[F.col(field.name).cast(field.dataType).alias(field.name) for field in schema.fields])


def conform_or_empty(spark: SparkSession, df: DataFrame | None, schema: StructType) -> DataFrame:
    """Conform a frame, or return an empty one when a read found no rows to read."""
    return spark.createDataFrame([], schema) if df is None else conform(df, schema)


def conform_logs(spark: SparkSession, df: DataFrame | None) -> DataFrame:
    """Conform outbox rows, turning the text foreign_key into the order id (NULL if it is not a number)."""
    if df is None:
        return spark.createDataFrame([], LOGS_SCHEMA)
    return conform(df.withColumn("order_id", F.expr("try_cast(foreign_key AS BIGINT)")), LOGS_SCHEMA)


def _read_query(spark: SparkSession, source: JdbcSource, sql: str) -> DataFrame:
    return spark.read.format("jdbc").options(**source.options()).option("query", sql).load()


def _read_in(
    spark: SparkSession,
    source: JdbcSource,
    *,
    sql: str,
    column: str,
    values: Iterable,
    quoted: bool = False,
) -> DataFrame | None:
    rendered: Sequence[str] = sorted({v if quoted else str(int(v)) for v in values})
    if not rendered:
        return None
    predicates = [
        f"{column} IN ({', '.join(rendered[i : i + LOOKUP_CHUNK])})" for i in range(0, len(rendered), LOOKUP_CHUNK)
    ]
    properties = {k: v for k, v in source.options().items() if k != "url"}
    return spark.read.jdbc(source.url, f"({sql}) AS src", predicates=predicates, properties=properties)


def _table_of(sql: str) -> str:
    return sql.split(" FROM ", 1)[1].split()[0]


def _ts(value: datetime) -> str:
    """Format an instant as a UTC DATETIME literal (aware values are converted, naive ones are taken as UTC)."""
    if value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    return value.strftime("%Y-%m-%d %H:%M:%S.%f")

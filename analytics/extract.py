"""Reading the shop's tables into Spark over JDBC, limited to the reported days plus a look-back on each side.

The two services keep their own databases, which may sit on different servers: orders and transaction_log are read
from the order service's (`default`), order_credits and the dead letters from the credits service's (`credits`).
Each read goes to the one source that holds its table (analytics/jdbc.py), and the two sides meet only in Spark's
joins, never in SQL.

Each windowed table is planned once (`plan_window`: MIN and MAX of its primary key and the row count over the
window, answered from the created_at index alone, since InnoDB appends the key to it) and then read in primary-key
ranges, one JDBC partition each, so every query is a range scan of the clustered index. Only the columns the
checks and analytics use are read. Rows a check needs but that fall outside the window (a credit awarded today
for a week-old order) are looked up afterwards by key ranges around the ids analytics/lookups.py names, so the
window only decides speed, never the answer. Every frame is conformed to a fixed schema, so the transforms see the
same types the tests build.
"""

import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime

from django.db import connections
from django.db.models import DateTimeField, Model
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from analytics import segment_sql
from analytics.jdbc import JdbcSource, Sources
from analytics.models import DailyMetrics
from analytics.schemas import (
    CREDITS_SCHEMA,
    DAILY_HISTORY_SCHEMA,
    DEAD_LETTERS_SCHEMA,
    FIRST_ORDERS_SCHEMA,
    LOGS_SCHEMA,
    ORDERS_SCHEMA,
)
from core.contract import BUSINESS_ORDER
from credits.models import DeadLetter, OrderCredit
from orders.models import Order
from outbox.models import TransactionLog

# Rows one JDBC query reads before another partition is worth its connection and task (a day of 46,000 orders
# reads faster as one query than as four on two cores).
ROWS_PER_PARTITION = 200_000
# Key ranges ORed in one look-up query at most (MariaDB's range optimizer takes thousands in its default memory).
RANGES_PER_QUERY = 1_000
# The outbox rows of orders (the job's business); foreign_key is the order id as text.
ORDER_BUSINESS = BUSINESS_ORDER


@dataclass(frozen=True)
class Table:
    """A table the job reads over the window: its name, the columns it needs, and the key its reads split on."""

    name: str
    columns: tuple[str, ...]
    # The columns among them that are DATETIME (UTC), read as integers (see read_table).
    timestamps: tuple[str, ...] = ()
    # The primary key: an integer, or (transaction_log) time-ordered hex text of a fixed width.
    key: str = "id"
    # A condition every read of the table adds (the outbox rows of orders only).
    where: str = ""


def model_table(model: type[Model], columns: tuple[str, ...], **options: str) -> Table:
    """Return the Table of a model's columns, its DATETIME ones found from the model's fields."""
    fields = {field.column: field for field in model._meta.concrete_fields}
    timestamps = tuple(c for c in columns if isinstance(fields[c], DateTimeField))
    return Table(model._meta.db_table, columns, timestamps=timestamps, **options)


ORDERS = model_table(Order, ("id", "user_id", "total", "created_at"))
# try_cast (in Spark) turns a non-numeric foreign_key into a NULL order id instead of failing the run.
LOGS = model_table(
    TransactionLog,
    ("id", "foreign_key", "status", "attempts", "created_at"),
    where=f"business = '{ORDER_BUSINESS}'",
)
CREDITS = model_table(OrderCredit, ("id", "user_id", "order_id", "total", "created_at", "ordered_at"))
# A DATETIME column travels as microseconds since the epoch, under this suffix: the JDBC driver turns each DATETIME
# value into a java.sql.Timestamp through a new Calendar, most of a read's CPU: read as an integer, the column costs
# the driver's JVM about as much as leaving it out. The values are UTC without a zone, so the difference from the
# epoch is exact.
MICROS_SUFFIX = "__micros"


@dataclass(frozen=True)
class Span:
    """What the window holds of one table: the smallest and largest key there, and how many rows."""

    lower: int | str | None
    upper: int | str | None
    rows: int


@dataclass(frozen=True)
class WindowPlan:
    """The window [start, end) and each windowed table's span in it, found before anything is read."""

    start: datetime
    end: datetime
    orders: Span
    logs: Span
    credits: Span


def plan_window(sources: Sources, *, start: datetime, end: datetime) -> WindowPlan:
    """Find each windowed table's key span and row count in [start, end), the three queries side by side.

    Each is answered from the table's created_at index alone (InnoDB appends the primary key to it), so planning
    never touches a row; the orders' count also sizes the Spark session.
    """
    tables = {"orders": (sources.orders, ORDERS), "logs": (sources.orders, LOGS), "credits": (sources.credits, CREDITS)}
    with ThreadPoolExecutor(max_workers=len(tables), thread_name_prefix="plan") as pool:
        futures = {
            name: pool.submit(_in_own_connection, lambda s=source, t=table: _span(s, t, start=start, end=end))
            for name, (source, table) in tables.items()
        }
        spans = {name: future.result() for name, future in futures.items()}
    return WindowPlan(start=start, end=end, **spans)


def _span(source: JdbcSource, table: Table, *, start: datetime, end: datetime) -> Span:
    with connections[source.alias].cursor() as cursor:
        # Identifiers come from this module's constants.
        cursor.execute(
            f"SELECT MIN({table.key}), MAX({table.key}), COUNT(*) FROM {table.name} "  # noqa: S608
            "WHERE created_at >= %s AND created_at < %s",
            [start, end],
        )
        lower, upper, rows = cursor.fetchone()
    return Span(lower=lower, upper=upper, rows=rows)


@dataclass
class Extracted:
    """The rows a run works on. Window frames cover [start, end); look-ups add rows found outside it."""

    orders: DataFrame
    logs: DataFrame
    credits: DataFrame
    dead_letters: DataFrame
    first_orders: DataFrame
    history: DataFrame


def extract_window(spark: SparkSession, sources: Sources, plan: WindowPlan) -> Extracted:
    """Set up the reads of orders, outbox rows and credits created in the planned window, and the side tables.

    Nothing is read yet (Spark reads when a job needs the rows); setting up a read asks MariaDB for the table's
    schema, a round trip each, so the six are set up side by side.
    """
    orders, credits = sources.orders, sources.credits
    reads = {
        "orders": lambda: conform(read_window(spark, orders, ORDERS, plan, plan.orders), ORDERS_SCHEMA),
        "logs": lambda: conform_logs(read_window(spark, orders, LOGS, plan, plan.logs)),
        "credits": lambda: conform(read_window(spark, credits, CREDITS, plan, plan.credits), CREDITS_SCHEMA),
        "dead_letters": lambda: read_open_dead_letters(spark, credits),
        "first_orders": lambda: read_first_orders(spark, orders, since_id=plan.orders.lower),
        "history": lambda: read_daily_history(spark, orders),
    }
    with ThreadPoolExecutor(max_workers=len(reads), thread_name_prefix="extract") as pool:
        futures = {name: pool.submit(_in_own_connection, read) for name, read in reads.items()}
        frames = {name: future.result() for name, future in futures.items()}
    return Extracted(**frames)


def _in_own_connection(read):
    """Run a read on a worker thread, closing the database connections Django opened for that thread."""
    try:
        return read()
    finally:
        connections.close_all()


def read_window(spark: SparkSession, source: JdbcSource, table: Table, plan: WindowPlan, span: Span) -> DataFrame:
    """Read a table's rows created in the window, in key ranges of about ROWS_PER_PARTITION rows each.

    Up to ANALYTICS_JDBC_PARTITIONS ranges split the span evenly (keys grow with time, so rows spread evenly over
    them); the first and last are open-ended, so rows written after planning (the look-back reaching into today)
    are read too, as the created_at condition allows.
    """
    partitions = max(1, min(source.partitions, math.ceil(span.rows / ROWS_PER_PARTITION)))
    window = f"created_at >= '{_ts(plan.start)}' AND created_at < '{_ts(plan.end)}'"
    where = f"{table.where} AND {window}" if table.where else window
    bounds = _split(span.lower, span.upper, partitions) if span.lower is not None else []
    predicates = [f"{where} AND {condition}" for condition in _range_conditions(table.key, bounds)]
    return read_table(spark, source, table, predicates)


def _split(lower: int | str, upper: int | str, parts: int) -> list[str]:
    """Return the parts - 1 inner boundaries splitting [lower, upper] evenly, as SQL literals.

    Text keys are split as the hex numbers they are (transaction ids: 32 hex digits, time first); a text key that
    is not hex of one width is not split.
    """
    if isinstance(lower, int):
        step = (upper - lower + 1) / parts
        return [str(bound) for bound in sorted({lower + math.ceil(step * i) for i in range(1, parts)})]
    width = len(lower)
    if len(upper) != width or not _is_hex(lower) or not _is_hex(upper):
        return []
    low, high = int(lower, 16), int(upper, 16)
    step = (high - low + 1) / parts
    return sorted({f"'{low + math.ceil(step * i):0{width}x}'" for i in range(1, parts)})


def _is_hex(value: str) -> bool:
    return all(c in "0123456789abcdef" for c in value)


def _range_conditions(key: str, bounds: Sequence[str]) -> list[str]:
    """Return conditions covering every key: below the first boundary, between each two, from the last on."""
    if not bounds:
        return ["1 = 1"]
    edges = [None, *bounds, None]
    return [
        " AND ".join(part for part in (f"{key} >= {low}" if low else "", f"{key} < {high}" if high else "") if part)
        for low, high in zip(edges, edges[1:], strict=False)
    ]


def read_missing(
    spark: SparkSession, source: JdbcSource, table: Table, *, column: str, ranges: Sequence[tuple[int, int]]
) -> DataFrame | None:
    """Read a table's rows whose `column` falls in one of the ranges (inclusive id pairs), wherever in time.

    The ranges are ORed, at most RANGES_PER_QUERY to a query, the queries spread over ANALYTICS_JDBC_PARTITIONS
    or more partitions. foreign_key is text: its ranges are compared as text between numbers of one length, which
    the (business, foreign_key) index answers.
    """
    if not ranges:
        return None
    if column == "foreign_key":
        conditions = [piece for low, high in ranges for piece in segment_sql.text_ranges(column, low, high)]
    else:
        conditions = [f"{column} BETWEEN {int(low)} AND {int(high)}" for low, high in ranges]
    per_query = min(math.ceil(len(conditions) / source.partitions), RANGES_PER_QUERY)
    where = f"{table.where} AND " if table.where else ""
    predicates = [
        f"{where}({' OR '.join(conditions[i : i + per_query])})" for i in range(0, len(conditions), per_query)
    ]
    return read_table(spark, source, table, predicates)


def read_table(spark: SparkSession, source: JdbcSource, table: Table, predicates: list[str]) -> DataFrame:
    """Read a table's needed columns, one JDBC partition per predicate, its DATETIME columns as integers.

    The integers come from a derived table that keeps every column of the table, so the predicates read as they
    would on the table; MariaDB merges it into the outer query, which still scans the key ranges by index.
    """
    properties = {k: v for k, v in source.options().items() if k != "url"}
    stamps = table.timestamps
    micros = "".join(f", TIMESTAMPDIFF(MICROSECOND, '1970-01-01', {c}) AS {c}{MICROS_SUFFIX}" for c in stamps)
    # Identifiers come from this module's constants.
    derived = f"(SELECT *{micros} FROM {table.name}) AS {table.name}"  # noqa: S608
    frame = spark.read.jdbc(source.url, derived, predicates=predicates, properties=properties)
    return frame.select(
        *[F.timestamp_micros(F.col(f"{c}{MICROS_SUFFIX}")).alias(c) if c in stamps else c for c in table.columns]
    )


def read_first_orders(spark: SparkSession, source: JdbcSource, *, since_id: int | None) -> DataFrame:
    """Return each user whose first order ever is `since_id` (the window's first order) or later, with its id.

    Ids grow with time, so "first order" is MIN(id), which MariaDB answers from the user_id index alone
    (a loose index scan: one probe per user, however long the history).
    """
    if since_id is None:
        return spark.createDataFrame([], FIRST_ORDERS_SCHEMA)
    sql = (
        f"SELECT user_id, MIN(id) AS first_order_id FROM {ORDERS.name} "  # noqa: S608
        f"GROUP BY user_id HAVING MIN(id) >= {int(since_id)}"
    )
    return conform(_read_query(spark, source, sql), FIRST_ORDERS_SCHEMA)


def read_daily_history(spark: SparkSession, source: JdbcSource) -> DataFrame:
    """Read the daily metrics earlier runs stored (one small row per day), for the trends."""
    columns = ", ".join(field.name for field in DAILY_HISTORY_SCHEMA.fields)
    sql = f"SELECT {columns} FROM {DailyMetrics._meta.db_table}"  # noqa: S608
    return conform(_read_query(spark, source, sql), DAILY_HISTORY_SCHEMA)


def read_open_dead_letters(spark: SparkSession, source: JdbcSource) -> DataFrame:
    """Read the open dead-lettered credit messages: their id, order, status and first failure (as created_at)."""
    column = {name: DeadLetter._meta.get_field(name).column for name in ("id", "order_id", "status", "first_failed_at")}
    # Names from the model; the status a choice of the model's.
    sql = (
        f"SELECT {column['id']} AS id, {column['order_id']} AS order_id, {column['status']} AS status, "  # noqa: S608
        f"{column['first_failed_at']} AS created_at FROM {DeadLetter._meta.db_table} "
        f"WHERE {column['status']} = '{DeadLetter.Status.OPEN.value}'"
    )
    return conform(_read_query(spark, source, sql), DEAD_LETTERS_SCHEMA)


def conform(df: DataFrame, schema: StructType) -> DataFrame:
    """Select the schema's columns, cast to its types, whatever types the JDBC dialect chose."""
    return df.select(*[F.col(field.name).cast(field.dataType).alias(field.name) for field in schema.fields])


def conform_logs(df: DataFrame) -> DataFrame:
    """Conform outbox rows, turning the text foreign_key into the order id (NULL if it is not a number)."""
    return conform(df.withColumn("order_id", F.expr("try_cast(foreign_key AS BIGINT)")), LOGS_SCHEMA)


def _read_query(spark: SparkSession, source: JdbcSource, sql: str) -> DataFrame:
    return spark.read.format("jdbc").options(**source.options()).option("query", sql).load()


def _ts(value: datetime) -> str:
    """Format an instant as a UTC DATETIME literal (aware values are converted, naive ones are taken as UTC)."""
    if value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    return value.strftime("%Y-%m-%d %H:%M:%S.%f")

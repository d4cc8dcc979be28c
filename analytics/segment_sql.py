"""The plain SQL of the nightly job's comparisons, in one place, built from the models' metadata.

Each service's database answers small aggregates over its own rows (per user, per key range, per day), so only
the aggregates cross the wire and rows travel only where the two sides disagree (analytics/segments.py). The
statements are text for Spark's JDBC reader (`dbtable` subqueries and `predicates`), so table and column names
come from the models' `_meta` (never typed by hand; analytics/tests/test_segment_sql.py fails when they drift),
and every value in them is an integer or a UTC timestamp this module formats itself.

The row hash: 60 bits from two CRC32s, of the text and of the text reversed (`(CRC32(t) << 28) ^ CRC32(REVERSE(t))`),
over text both sides form identically: orders `<id>:<2 x total>`, credits `<order_id>:<amount>`. Its SUM is an exact
DECIMAL (sent reduced modulo 2^60), so a segment agrees only if its rows pair up; unlike a count and a sum, it sees
amounts swapped between two orders, and a missing credit plus an orphan whose order ids sum alike. A second hash over
`<id>:<microseconds of the instant>` pairs an order's created_at with its credit's ordered_at, for users whose
credits all carry one.
"""

from dataclasses import dataclass
from datetime import UTC, datetime

from core.contract import BUSINESS_ORDER
from credits.models import OrderCredit
from orders.models import Order
from outbox.models import TransactionLog

# The outbox rows of orders (the job's business); their foreign_key is the order id as text.
ORDER_BUSINESS = BUSINESS_ORDER
# Outbox states a stuck row can be in (analytics.checks.check_stuck_outbox judges them).
UNPUBLISHED = (TransactionLog.Status.PENDING.value, TransactionLog.Status.DEAD.value)
# A foreign_key the range comparison covers: a decimal without leading zeros, short enough for BIGINT; any other
# text is fetched as a row (analytics.checks reports it as log_without_order).
_CANONICAL_KEY = "^[1-9][0-9]{0,17}$"
# The per-user aggregates have as many groups as the period has users: grouping by a sort of the rows costs the
# server less than its in-memory temporary table does at that many groups (MariaDB picks the table unless told).
MANY_GROUPS = "SQL_BIG_RESULT"
# A hash sum travels reduced modulo 2^60 and in base 36: 12 characters at most, where the exact sum takes 20 decimal
# digits, and it is most of an aggregate row's bytes. Two segments whose rows differ still agree only by a chance
# of one in 2^60, the row hash's own; Spark reduces its sums of them, and of fetched rows, the same way.
HASH_MODULUS = 2**60
HASH_BASE = 36


def _columns(model, *names: str) -> dict[str, str]:
    meta = model._meta
    return {name: meta.get_field(name).column for name in names}


@dataclass(frozen=True)
class Tables:
    """Table and column names, read from the models each time they are built (cheap: a handful of look-ups)."""

    orders: str
    order: dict[str, str]
    credits: str
    credit: dict[str, str]
    logs: str
    log: dict[str, str]


def tables() -> Tables:
    return Tables(
        orders=Order._meta.db_table,
        order=_columns(Order, "id", "user_id", "total", "created_at"),
        credits=OrderCredit._meta.db_table,
        credit=_columns(OrderCredit, "id", "user_id", "order_id", "amount", "created_at", "ordered_at"),
        logs=TransactionLog._meta.db_table,
        log=_columns(TransactionLog, "id", "business", "foreign_key", "status", "created_at"),
    )


def ts(value: datetime) -> str:
    """A UTC DATETIME literal (aware values converted, naive ones taken as UTC)."""
    if value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    return "'" + value.strftime("%Y-%m-%d %H:%M:%S.%f") + "'"


def row_hash(text: str) -> str:
    """The 60-bit hash of a row's text, as an unsigned integer (NULL when the text is).

    CRC32 rather than a cryptographic digest: the databases evaluate it for every row of the period, and MD5 with the
    hex-to-integer conversion it needs is most of what a per-user aggregate costs the server. The hash guards against
    accidents, not an adversary; summed as integers, the two CRCs' linearity over bits does not carry over to the sum.
    Spark computes the same value (analytics.segments.recompute_users) with its crc32, zlib's polynomial as MariaDB's.
    """
    return f"((CRC32({text}) << 28) ^ CRC32(REVERSE({text})))"


def pair(left: str, right: str) -> str:
    """The text `<left>:<right>` both sides hash."""
    return f"CONCAT({left}, ':', {right})"


def micros(column: str) -> str:
    return f"TIMESTAMPDIFF(MICROSECOND, '1970-01-01', {column})"


def exact_sum(expression: str) -> str:
    """The sum of row hashes, exact, reduced modulo HASH_MODULUS and written in base HASH_BASE (NULL for no rows)."""
    # Below 2^60 a row, so DECIMAL(38,0) holds the sum of 10^19 rows exactly before it is reduced.
    return f"CONV(CAST(SUM({expression}) AS DECIMAL(38,0)) MOD {HASH_MODULUS}, 10, {HASH_BASE})"


def between(column: str, low: int, high: int) -> str:
    return f"{column} BETWEEN {int(low)} AND {int(high)}"


def in_window(column: str, start: datetime, end: datetime) -> str:
    return f"{column} >= {ts(start)} AND {column} < {ts(end)}"


def keys_within(column: str, keys: tuple | None) -> str:
    """`<column> BETWEEN lower AND upper AND ` for the period's primary-key span (integers, or hex text), so a scan
    by time becomes a sequential range of the clustered index; empty when the span is unknown.
    """
    if keys is None or keys[0] is None:
        return ""
    lower, upper = keys
    if isinstance(lower, int):
        return f"{between(column, lower, upper)} AND "
    if not all(c in "0123456789abcdef" for c in lower + upper):
        return ""
    return f"{column} BETWEEN '{lower}' AND '{upper}' AND "


def orders_per_user(low: int, high: int) -> str:
    """Per user and day of the orders with ids in [low, high]: count, 2 x total, and both hashes summed."""
    t = tables()
    o = t.order
    checksum = exact_sum(row_hash(pair(o["id"], f"2 * {o['total']}")))
    dated = exact_sum(row_hash(pair(o["id"], micros(o["created_at"]))))
    return (
        f"SELECT {MANY_GROUPS} {o['user_id']} AS user_id, DATE({o['created_at']}) AS date, COUNT(*) AS `rows`, "  # noqa: S608
        f"CAST(SUM(2 * {o['total']}) AS SIGNED) AS amount, {checksum} AS checksum, {dated} AS dated "
        f"FROM {t.orders} WHERE {between(o['id'], low, high)} "
        f"GROUP BY {o['user_id']}, DATE({o['created_at']})"
    )


def credits_per_user(low: int, high: int, from_key: int | None = None) -> str:
    """Per user, the credits of orders with ids in [low, high] wherever in time: count, amount, hashes, and how
    many carry ordered_at (their dated hash pairs with the orders' only when all of a user's credits do).

    With `from_key` (a credit key below every credit of those orders, analytics.segments.credits_scan_start), the
    credits are read along the primary key from there, in order, instead of one by one through the order_id index.
    """
    t = tables()
    c = t.credit
    checksum = exact_sum(row_hash(pair(c["order_id"], c["amount"])))
    dated = exact_sum(row_hash(pair(c["order_id"], micros(c["ordered_at"]))))
    source = f"{t.credits} WHERE "
    if from_key is not None:
        source = f"{t.credits} FORCE INDEX (PRIMARY) WHERE {c['id']} >= {int(from_key)} AND "
    return (
        f"SELECT {MANY_GROUPS} {c['user_id']} AS user_id, COUNT(*) AS `rows`, "  # noqa: S608
        f"CAST(SUM({c['amount']}) AS SIGNED) AS amount, {checksum} AS checksum, "
        f"COUNT({c['ordered_at']}) AS dated_rows, {dated} AS dated "
        f"FROM {source}{between(c['order_id'], low, high)} GROUP BY {c['user_id']}"
    )


def credit_keys_since(since: datetime) -> str:
    """The key of the first credit written at or after `since` (one step of the created_at index), and the last key."""
    t = tables()
    c = t.credit
    return (
        f"SELECT (SELECT {c['id']} FROM {t.credits} WHERE {c['created_at']} >= {ts(since)} "  # noqa: S608
        f"ORDER BY {c['created_at']}, {c['id']} LIMIT 1), (SELECT MAX({c['id']}) FROM {t.credits})"
    )


def credits_per_user_day(start: datetime, end: datetime, keys: tuple | None = None) -> str:
    """Per day and user, the credits awarded in [start, end): count and amount (the reports' credit side)."""
    t = tables()
    c = t.credit
    return (
        f"SELECT {MANY_GROUPS} DATE({c['created_at']}) AS date, {c['user_id']} AS user_id, "  # noqa: S608
        f"COUNT(*) AS credits_awarded, CAST(SUM({c['amount']}) AS SIGNED) AS credits_total "
        f"FROM {t.credits} WHERE {keys_within(c['id'], keys)}{in_window(c['created_at'], start, end)} "
        f"GROUP BY DATE({c['created_at']}), {c['user_id']}"
    )


def latency_histogram(start: datetime, end: datetime, keys: tuple | None = None) -> str:
    """Per day and whole millisecond from ordered_at to award: how many credits awarded in [start, end)."""
    t = tables()
    c = t.credit
    ms = f"ROUND(TIMESTAMPDIFF(MICROSECOND, {c['ordered_at']}, {c['created_at']}) / 1000)"
    return (
        f"SELECT DATE({c['created_at']}) AS date, CAST({ms} AS SIGNED) AS ms, COUNT(*) AS credits "  # noqa: S608
        f"FROM {t.credits} WHERE {keys_within(c['id'], keys)}{in_window(c['created_at'], start, end)} "
        f"AND {c['ordered_at']} IS NOT NULL "
        f"GROUP BY DATE({c['created_at']}), {ms}"
    )


def new_users_per_day(since_id: int, start: datetime, end: datetime) -> str:
    """Per day in [start, end), users whose first order ever (MIN(id), from the user_id index) was placed then."""
    t = tables()
    o = t.order
    return (
        f"SELECT DATE(o.{o['created_at']}) AS date, COUNT(*) AS new_users FROM ("  # noqa: S608
        f"SELECT MIN({o['id']}) AS first_id FROM {t.orders} GROUP BY {o['user_id']} "
        f"HAVING MIN({o['id']}) >= {int(since_id)}) AS f "
        f"JOIN {t.orders} AS o ON o.{o['id']} = f.first_id "
        f"WHERE {in_window('o.' + o['created_at'], start, end)} GROUP BY DATE(o.{o['created_at']})"
    )


def _log_key() -> str:
    return f"CAST({tables().log['foreign_key']} AS UNSIGNED)"


def log_covered(low: int, high: int) -> str:
    """The outbox rows of orders whose foreign_key is an order id in [low, high] (what the ranges compare)."""
    log = tables().log
    return (
        f"{log['business']} = '{ORDER_BUSINESS}' AND {log['foreign_key']} REGEXP '{_CANONICAL_KEY}' "
        f"AND {between(_log_key(), low, high)}"
    )


def text_ranges(column: str, low: int, high: int) -> list[str]:
    """[low, high] as conditions on a text column of decimal numbers, one per digit count (text order is number order
    between numbers of one length), which the (business, foreign_key) index answers."""
    pieces = []
    low, high = int(low), int(high)
    while low <= high:
        top = min(high, 10 ** len(str(low)) - 1)
        pieces.append(f"({column} BETWEEN '{low}' AND '{top}' AND CHAR_LENGTH({column}) = {len(str(low))})")
        low = top + 1
    return pieces


def _text_ranges(column: str, low: int, high: int) -> str:
    return "(" + " OR ".join(text_ranges(column, low, high)) + ")"


def ranges_compared(ranges: list[tuple[int, int]], width: int) -> tuple[str, str]:
    """Per bucket of `width` order ids within the ranges: the orders' count and id hash, and the outbox rows'.

    Both sides hash the order id as text (the outbox row's foreign_key is that text), so a bucket agrees only when
    each of its orders has exactly one outbox row and each row its order.
    """
    t = tables()
    o, log = t.order, t.log
    width = int(width)
    orders_where = " OR ".join(f"({between(o['id'], lo, hi)})" for lo, hi in ranges)
    logs_where = " OR ".join(
        f"({_text_ranges(log['foreign_key'], lo, hi)} AND {log_covered(lo, hi)})" for lo, hi in ranges
    )
    order_hash = exact_sum(row_hash(f"CAST({o['id']} AS CHAR)"))
    orders = (
        f"SELECT FLOOR({o['id']} / {width}) AS bucket, COUNT(*) AS `rows`, {order_hash} AS checksum "  # noqa: S608
        f"FROM {t.orders} "
        f"WHERE {orders_where} GROUP BY FLOOR({o['id']} / {width})"
    )
    logs = (
        f"SELECT FLOOR({_log_key()} / {width}) AS bucket, COUNT(*) AS `rows`, "  # noqa: S608
        f"{exact_sum(row_hash(log['foreign_key']))} AS checksum FROM {t.logs} "
        f"WHERE {logs_where} GROUP BY FLOOR({_log_key()} / {width})"
    )
    return orders, logs


def late_credits(low: int, high: int, start: datetime, end: datetime, keys: tuple | None = None) -> str:
    """Credits awarded in [start, end) for orders outside [low, high] (a week-old order credited today)."""
    c = tables().credit
    window = in_window(c["created_at"], start, end)
    return f"{keys_within(c['id'], keys)}{window} AND NOT ({between(c['order_id'], low, high)})"


def late_logs(low: int, high: int, start: datetime, end: datetime, keys: tuple | None = None) -> str:
    """Outbox rows of orders written in [start, end) that the ranges over [low, high] do not cover."""
    log = tables().log
    return (
        f"{keys_within(log['id'], keys)}{log['business']} = '{ORDER_BUSINESS}' "
        f"AND {in_window(log['created_at'], start, end)} AND NOT ({log_covered(low, high)})"
    )


def unpublished_logs(start: datetime, end: datetime) -> str:
    """Outbox rows of orders written in [start, end) still pending or dead: a range of the (status, ...) index."""
    log = tables().log
    states = ", ".join(f"'{s}'" for s in UNPUBLISHED)
    return (
        f"{log['status']} IN ({states}) AND {log['business']} = '{ORDER_BUSINESS}' "
        f"AND {in_window(log['created_at'], start, end)}"
    )


def orders_of_users(low: int, high: int, users: list[tuple[int, int]]) -> str:
    """Orders with ids in [low, high] of the users in these (inclusive) user id ranges."""
    o = tables().order
    return f"{between(o['id'], low, high)} AND ({' OR '.join(between(o['user_id'], a, b) for a, b in users)})"


def credits_of_users(low: int, high: int, users: list[tuple[int, int]]) -> str:
    """Credits of orders with ids in [low, high] held by the users in these (inclusive) user id ranges."""
    c = tables().credit
    return f"{between(c['order_id'], low, high)} AND ({' OR '.join(between(c['user_id'], a, b) for a, b in users)})"


def orders_in(ranges: list[tuple[int, int]]) -> str:
    o = tables().order
    return " OR ".join(f"({between(o['id'], lo, hi)})" for lo, hi in ranges)


def logs_in(ranges: list[tuple[int, int]]) -> str:
    log = tables().log
    return " OR ".join(f"({_text_ranges(log['foreign_key'], lo, hi)} AND {log_covered(lo, hi)})" for lo, hi in ranges)

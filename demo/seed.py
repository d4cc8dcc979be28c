"""Bulk-load a consistent demo history: orders, their published outbox rows, their credits.

Orders and outbox rows go to the order service's database, credits and balances to the credits service's: each
table is written through the database its model is routed to (one database or two, the code is the same).
Rows go in as multi-row INSERT statements with their values written in (core/sql.Insert.literal_rows; ids
assigned up front, so the three tables can be written in one pass without reading anything back), in one
transaction per batch, with unique and foreign-key checks off for the session: the generator guarantees uniqueness,
and the checks cost more than the inserts. Columns the generator does not fill get their database default; a column
added to these models without one makes Insert refuse the statement. Everything streams: one batch per table is
held at a time, whatever the number of orders.
"""

import contextlib
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from queue import Queue

from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import make_password
from django.db import connections, models, router, transaction

from core.contract import BUSINESS_ORDER, ORDER_TOTAL_MAX, SCHEMA_VERSION
from core.sql import Insert
from credits.models import CreditBalance, OrderCredit
from orders.models import Order
from outbox.models import TransactionLog

DEMO_USERNAME_PREFIX = "demo-"
GOODS = (
    "espresso beans",
    "green tea",
    "notebook",
    "fountain pen",
    "headphones",
    "usb cable",
    "desk lamp",
    "backpack",
    "water bottle",
    "sneakers",
    "rain jacket",
    "board game",
    "yoga mat",
    "coffee mug",
    "phone case",
    "bluetooth speaker",
)
# Orders per weekday relative to Monday, and per hour of the day: a shop is busier at weekends and in the evening.
WEEKDAY_WEIGHTS = (1.0, 0.95, 1.0, 1.05, 1.15, 1.3, 1.2)
HOUR_WEIGHTS = (1, 1, 1, 1, 1, 2, 3, 5, 6, 7, 7, 8, 9, 8, 7, 7, 8, 9, 10, 11, 11, 9, 5, 2)
# 5,000 orders (15,000 rows) per transaction is past the knee (docs/PERFORMANCE.md, "Nightly analytics"): bigger
# batches only grow the statements without loading faster.
DEFAULT_BATCH_ORDERS = 5_000
MINUTES_PER_DAY = 24 * 60
USERS_PER_INSERT = 5_000
PUBLISHED = str(TransactionLog.Status.PUBLISHED)


@dataclass(frozen=True)
class SeedResult:
    orders: int
    users: int
    rows: int
    first_order_id: int | None
    last_order_id: int | None
    seconds: float

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds if self.seconds else 0.0


def demo_users_ensure(*, count: int) -> list[int]:
    """Return the ids of `count` demo users, creating the missing ones with multi-row INSERTs."""
    user_model = get_user_model()
    demo = user_model.objects.filter(username__startswith=DEMO_USERNAME_PREFIX)
    existing = list(demo.order_by("id").values_list("id", flat=True)[:count])
    missing = count - len(existing)
    if missing > 0:
        start = demo.count()
        password = make_password(None)
        # A chunk at a time: bulk_create makes a list of whatever it is given (half a million users for 10M orders).
        for first in range(0, missing, USERS_PER_INSERT):
            user_model.objects.bulk_create(
                [
                    user_model(username=f"{DEMO_USERNAME_PREFIX}{start + i:07d}", password=password)
                    for i in range(first, min(missing, first + USERS_PER_INSERT))
                ],
                ignore_conflicts=True,
            )
        existing = list(demo.order_by("id").values_list("id", flat=True)[:count])
    return existing


def seed_demo_data(
    *,
    orders: int,
    days: int,
    users: int,
    end: date,
    seed: int | None = None,
    batch_orders: int = DEFAULT_BATCH_ORDERS,
    on_progress: Callable[[int], None] | None = None,
) -> SeedResult:
    """Load `orders` orders spread over `days` days ending on `end` (UTC), each with its published log row and credit.

    Ids continue after the current maximum, so run this against a database nobody else is writing orders to.
    """
    if orders < 1 or days < 1 or users < 1:
        raise ValueError("orders, days and users must be positive")
    started = time.monotonic()
    rng = random.Random(seed)
    user_ids = demo_users_ensure(count=users)
    next_order_id = _max_id(Order) + 1
    next_credit_id = _max_id(OrderCredit) + 1
    first_order_id = next_order_id
    first_day = end - timedelta(days=days - 1)
    batches = _generate_batches(
        rng=rng,
        counts=_orders_per_day(rng=rng, orders=orders, first_day=first_day, days=days),
        first_day=first_day,
        user_ids=user_ids,
        next_order_id=next_order_id,
        next_credit_id=next_credit_id,
        batch_orders=batch_orders,
    )
    rows = _write_parallel(batches, on_progress=on_progress)
    credit_balances_recompute(user_ids=user_ids)
    return SeedResult(
        orders=orders,
        users=len(user_ids),
        rows=rows,
        first_order_id=first_order_id,
        last_order_id=first_order_id + orders - 1,
        seconds=time.monotonic() - started,
    )


def _max_id(model: type[models.Model]) -> int:
    """Return the largest id in a model's table (0 when empty), read in the database that table lives in."""
    with connections[router.db_for_read(model)].cursor() as cursor:
        # The table name comes from the model.
        cursor.execute(f"SELECT COALESCE(MAX(id), 0) FROM {model._meta.db_table}")  # noqa: S608
        return cursor.fetchone()[0]


def credit_balances_recompute(*, user_ids: list[int]) -> None:
    """Set these users' credit_balances rows to the sum of their credits, as the consumer would have kept them.

    Both tables are the credits service's, so this is one statement in the credits database. It reads the table
    in key order (FORCE INDEX (PRIMARY)): for the half million users of a 10M-order seed the optimizer otherwise picks
    the user_id index and looks every credit up by key, at random, which held the 10M seed for minutes.
    """
    placeholders = ",".join(["%s"] * len(user_ids))
    sql = (
        "INSERT INTO credit_balances (user_id, balance, updated_at)"  # noqa: S608 (only placeholders are formatted)
        " SELECT user_id, SUM(total), UTC_TIMESTAMP(6) FROM order_credits FORCE INDEX (PRIMARY)"
        f" WHERE user_id IN ({placeholders}) GROUP BY user_id"
        " ON DUPLICATE KEY UPDATE balance = VALUES(balance), updated_at = VALUES(updated_at)"
    )
    with connections[router.db_for_write(CreditBalance)].cursor() as cursor:
        cursor.execute(sql, user_ids)


def _orders_per_day(*, rng: random.Random, orders: int, first_day: date, days: int) -> list[int]:
    """Split the orders over the days by weekday weight with a little noise, summing exactly to `orders`."""
    weights = [WEEKDAY_WEIGHTS[(first_day + timedelta(days=i)).weekday()] * rng.uniform(0.9, 1.1) for i in range(days)]
    scale = orders / sum(weights)
    counts = [int(w * scale) for w in weights]
    for i in range(orders - sum(counts)):
        counts[i % days] += 1
    return counts


def _orders_per_minute(*, rng: random.Random, count: int) -> list[int]:
    """Split a day's orders over its 1,440 minutes by hour weight, the remainder to minutes drawn by the same weight."""
    weights = [HOUR_WEIGHTS[minute // 60] for minute in range(MINUTES_PER_DAY)]
    scale = count / sum(weights)
    counts = [int(w * scale) for w in weights]
    for minute in rng.choices(range(MINUTES_PER_DAY), weights=weights, k=count - sum(counts)):
        counts[minute] += 1
    return counts


def _creation_times(*, rng: random.Random, counts: list[int], first_day: date) -> Iterator[float]:
    """Yield every order's creation time (Unix seconds, UTC) in ascending order, one minute's orders at a time.

    Streaming matters: a large day's orders sorted at once would be a list of one float per order, all in memory.
    """
    for day_index, count in enumerate(counts):
        day = first_day + timedelta(days=day_index)
        day_epoch = datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp()
        for minute, in_minute in enumerate(_orders_per_minute(rng=rng, count=count)):
            start = day_epoch + minute * 60
            yield from sorted([start + rng.random() * 60 for _ in range(in_minute)])


def _generate_batches(
    *,
    rng: random.Random,
    counts: list[int],
    first_day: date,
    user_ids: list[int],
    next_order_id: int,
    next_credit_id: int,
    batch_orders: int,
) -> Iterator[list[tuple[str, str, int]]]:
    """Yield per batch one (database alias, INSERT statement, row count) per table, in created_at order so ids follow
    time. Only one batch's rows are held at a time.
    """
    order_sql = Insert(Order, ("id", "user", "goods_name", "total", "transaction_id", "created_at"))
    log_sql = Insert(
        TransactionLog,
        (
            "id",
            "business",
            "foreign_key",
            "payload",
            "status",
            "attempts",
            "next_attempt_at",
            "published_at",
            "created_at",
        ),
    )
    # ordered_at as a version-2 message carries it: the order's created_at.
    credit_sql = Insert(
        OrderCredit, ("id", "user_id", "order_id", "amount", "transaction_id", "created_at", "ordered_at")
    )
    n_users = len(user_ids)
    order_id, credit_id = next_order_id, next_credit_id
    order_rows: list[tuple] = []
    log_rows: list[tuple] = []
    credit_rows: list[tuple] = []
    created_clock, published_clock, credited_clock = _Clock(), _Clock(), _Clock()
    for created in _creation_times(rng=rng, counts=counts, first_day=first_day):
        # A few heavy users and a long tail; mostly small quantities with the odd bulk order.
        user_id = user_ids[int(n_users * rng.random() ** 2)]
        quantity = 1 + int(rng.expovariate(0.35)) if rng.random() > 0.002 else rng.randint(100, 2_000)
        total = min(ORDER_TOTAL_MAX, quantity)
        tx = f"{int(created * 1000):012x}{rng.getrandbits(80):020x}"
        published = created + 0.01 + rng.random() * 0.2
        credited = published + rng.lognormvariate(0.0, 1.0)
        created_s, published_s = created_clock.literal(created), published_clock.literal(published)
        # What json.dumps writes for this dict (same keys, order and separators), at a fraction of its cost.
        payload = (
            f'{{"schema_version": {SCHEMA_VERSION}, "transaction_id": "{tx}", "order_id": {order_id}, '
            f'"user_id": {user_id}, "total": {total}}}'
        )
        goods = GOODS[order_id % len(GOODS)]
        order_rows.append((order_id, user_id, goods, total, tx, created_s))
        log_rows.append((tx, BUSINESS_ORDER, str(order_id), payload, PUBLISHED, 1, created_s, published_s, created_s))
        credit_rows.append((credit_id, user_id, order_id, 2 * total, tx, credited_clock.literal(credited), created_s))
        order_id += 1
        credit_id += 1
        if len(order_rows) >= batch_orders:
            yield _flush(order_sql, order_rows, log_sql, log_rows, credit_sql, credit_rows)
            order_rows, log_rows, credit_rows = [], [], []
    if order_rows:
        yield _flush(order_sql, order_rows, log_sql, log_rows, credit_sql, credit_rows)


def _flush(*pairs) -> list[tuple[str, str, int]]:
    return [
        (insert.database, insert.literal_rows(rows), len(rows))
        for insert, rows in zip(pairs[0::2], pairs[1::2], strict=True)
    ]


class _Clock:
    """Format Unix times as MariaDB DATETIME(6) literals in UTC, reusing the date and time of the last whole second.

    A busy day has many orders per second, so most calls only format the microseconds.
    """

    def __init__(self) -> None:
        self._second = -1
        self._prefix = ""

    def literal(self, ts: float) -> str:
        second = int(ts)
        if second != self._second:
            self._second, self._prefix = second, time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(second))
        return f"{self._prefix}.{int((ts - second) * 1_000_000):06d}"


def _write_parallel(batches: Iterator[list[tuple[str, str, int]]], *, on_progress: Callable[[int], None] | None) -> int:
    """Execute each table's statements on its own thread and connection to its database, in order; return the rows
    written.

    Generating the SQL (Python) and inserting into the three tables (MariaDB) overlap, which is what uses both
    cores of a small machine. Each statement commits on its own, so a failed load leaves whole batches behind.
    """
    queues: list[Queue] = []
    threads: list[threading.Thread] = []
    failures: list[BaseException] = []
    lock = threading.Lock()
    written = 0

    def write(queue: Queue, alias: str) -> None:
        nonlocal written
        try:
            connection = connections[alias]
            connection.ensure_connection()
            # The backend's own cursor, not connection.cursor(): under DEBUG, Django keeps the text of a connection's
            # last 9,000 statements, and these statements are megabytes each, so a large seed's memory would grow by
            # gigabytes.
            with contextlib.closing(connection.create_cursor()) as cursor:
                cursor.execute("SET SESSION unique_checks = 0, foreign_key_checks = 0")
                while (item := queue.get()) is not None:
                    if failures:
                        continue
                    _, statement, count = item
                    with transaction.atomic(using=alias):
                        cursor.execute(statement)
                    with lock:
                        written += count
                        if on_progress is not None:
                            on_progress(count)
        except BaseException as exc:  # re-raised in the calling thread
            failures.append(exc)
            while queue.get() is not None:
                pass
        finally:
            connections[alias].close()

    try:
        for statements in batches:
            if not queues:
                for alias, _, _ in statements:
                    queues.append(Queue(maxsize=2))
                    threads.append(threading.Thread(target=write, args=(queues[-1], alias), daemon=True))
                    threads[-1].start()
            if failures:
                break
            for queue, item in zip(queues, statements, strict=True):
                queue.put(item)
    finally:
        for queue in queues:
            queue.put(None)
        for thread in threads:
            thread.join()
    if failures:
        raise failures[0]
    return written

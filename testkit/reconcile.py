"""After a fault run: waiting for the credits and the outbox to catch up, and reconciling the ledger with both
services' databases (nothing lost, nothing credited twice, every amount right)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from testkit.load import Ledger


@dataclass
class Reconciliation:
    attempted: int
    acknowledged: int
    stored: int
    lost: int
    unacknowledged_stored: int
    credited: int
    missing_credits: int
    duplicated_credits: int
    wrong_amounts: int
    balance_mismatches: int
    gave_up: int
    # Dead letters recorded for these orders: none of the injected faults is a message's fault.
    dead_letters: int = 0
    # (user id, balance, sum of its credits) of each user whose balance is not the sum of its credits.
    balance_differences: tuple = ()

    @property
    def ok(self) -> bool:
        return not (
            self.lost
            or self.missing_credits
            or self.duplicated_credits
            or self.wrong_amounts
            or self.balance_mismatches
            or self.gave_up
        )

    def assert_nothing_lost_or_duplicated(self, *, logs: str = "") -> None:
        """Fail unless every acknowledged order was stored and credited once, with the right amount and balance."""
        wrong = {
            name: getattr(self, name)
            for name in (
                "lost",
                "gave_up",
                "unacknowledged_stored",
                "missing_credits",
                "duplicated_credits",
                "wrong_amounts",
                "balance_mismatches",
            )
            if getattr(self, name)
        }
        assert wrong == {}, f"{self}\n{logs}"


def reconcile(ledger: Ledger, user_ids: list[int]) -> Reconciliation:
    """Compare what clients were told with what each service's database holds (orders; credits, balances)."""
    from django.db import connections

    placeholders = ",".join(["%s"] * len(user_ids))
    with connections["default"].cursor() as cursor:
        cursor.execute(f"SELECT id, total FROM orders WHERE user_id IN ({placeholders})", user_ids)  # noqa: S608
        orders = dict(cursor.fetchall())
    with connections["credits"].cursor() as cursor:
        cursor.execute(
            f"SELECT order_id, COUNT(*), SUM(total) FROM order_credits WHERE user_id IN ({placeholders})"  # noqa: S608
            " GROUP BY order_id",
            user_ids,
        )
        credits = {order_id: (count, total) for order_id, count, total in cursor.fetchall()}
        balance_sql = (
            "SELECT b.user_id, b.balance, COALESCE(SUM(c.total), 0) FROM credit_balances b"
            " LEFT JOIN order_credits c ON c.user_id = b.user_id"
            f" WHERE b.user_id IN ({placeholders}) GROUP BY b.user_id, b.balance"
        )
        cursor.execute(balance_sql, user_ids)
        balance_differences = tuple(row for row in cursor.fetchall() if row[1] != row[2])
        order_placeholders = ",".join(["%s"] * len(orders)) or "NULL"
        cursor.execute(
            f"SELECT COUNT(*) FROM credit_dead_letters WHERE order_id IN ({order_placeholders})",  # noqa: S608
            list(orders),
        )
        (dead_letters,) = cursor.fetchone()

    acknowledged_ids = {order_id for order_id, _ in ledger.acknowledged.values()}
    return Reconciliation(
        attempted=ledger.attempted,
        acknowledged=len(ledger.acknowledged),
        stored=len(orders),
        lost=len(acknowledged_ids - set(orders)),
        unacknowledged_stored=len(set(orders) - acknowledged_ids),
        credited=len(credits),
        missing_credits=len(set(orders) - set(credits)),
        duplicated_credits=sum(count - 1 for count, _ in credits.values()),
        wrong_amounts=sum(1 for oid, (_, total) in credits.items() if oid in orders and total != 2 * orders[oid]),
        balance_mismatches=len(balance_differences),
        balance_differences=balance_differences,
        gave_up=ledger.gave_up,
        dead_letters=dead_letters,
    )


def wait_for_credits(ledger: Ledger, user_ids: list[int], *, timeout: float) -> tuple[Reconciliation, float]:
    """Poll until every stored order has its credit or the timeout passes; return the result and the time taken."""
    from django.db import connections

    started = time.monotonic()
    while True:
        for alias in ("default", "credits"):
            connections[alias].close()
        result = reconcile(ledger, user_ids)
        if result.missing_credits == 0 or time.monotonic() - started > timeout:
            return result, time.monotonic() - started
        time.sleep(0.5)


def wait_until_credited(order_ids: set[int], *, timeout: float) -> float:
    """Poll the credits database until every one of these orders has its credit; return the seconds it took."""
    from django.db import connections

    started = time.monotonic()
    connection = connections["credits"]
    placeholders = ",".join(["%s"] * len(order_ids)) or "NULL"
    while time.monotonic() - started < timeout:
        connection.close()  # after a fault, a connection from before it may be gone
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT COUNT(*) FROM order_credits WHERE order_id IN ({placeholders})", list(order_ids))
            if cursor.fetchone()[0] == len(order_ids):
                break
        time.sleep(0.25)
    return time.monotonic() - started


def wait_until_published(*, timeout: float) -> int:
    """Poll the outbox until no row is left to publish (pending, or dead) or the timeout passes; return how many are.

    A relay killed between a batch's publish and its mark leaves its rows pending, leased, until the lease runs out
    and another relay publishes them again (the consumer absorbs the duplicates): the credits can all be there while
    the outbox still holds rows it will send.
    """
    from django.db import connections

    from outbox.models import TransactionLog

    unsent = (TransactionLog.Status.PENDING, TransactionLog.Status.DEAD)
    deadline = time.monotonic() + timeout
    while True:
        connections["default"].close()  # after a fault, a connection from before it may be gone
        left = TransactionLog.objects.filter(status__in=unsent).count()
        if left == 0 or time.monotonic() > deadline:
            return left
        time.sleep(0.5)

"""Reads behind /admin/pipeline/: the whole pipeline's last hour at a glance, from both services' databases.

Each figure comes from the service that owns it: orders and the outbox from the order service's database, credits and
dead letters from the credits service's, in separate queries (never a join). The order-to-credit latency pairs the
two in Python: the newest credits of the hour first, then their orders' commit times by id.
"""

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import DatabaseError
from django.utils import timezone

from analytics.models import NightlyRun
from analytics.selectors import run_list
from core.minutes import Minutes, counts_per_minute
from core.stats import percentile
from credits.selectors import credit_award_times, credits_per_minute, dead_letters_open_count
from orders.models import Order
from outbox.selectors import OutboxStates, outbox_published_per_minute, outbox_states

logger = logging.getLogger(__name__)

WINDOW = timedelta(hours=1)
# The latency is computed from at most this many of the hour's newest credits: enough for a steady p99, and a bounded
# page load however busy the hour was (the service sustains well over a thousand awards a second).
LATENCY_SAMPLE = 20_000
# Order ids per query when reading the sampled orders' commit times.
ID_CHUNK = 2_000


@dataclass(frozen=True)
class Latency:
    """Order commit to credit commit over the credits of the window (or the newest LATENCY_SAMPLE of them)."""

    count: int
    sampled: bool
    p50_seconds: float | None
    p99_seconds: float | None


@dataclass(frozen=True)
class CreditsSide:
    """What the credits service's database says; absent as a whole when that database does not answer."""

    credited_per_minute: list[int]
    latency: Latency
    dead_letters_open: int


@dataclass(frozen=True)
class Pipeline:
    now: datetime
    minutes: Minutes
    orders_last_hour: int
    orders_per_minute: list[int]
    outbox: OutboxStates
    published_per_minute: list[int]
    credits: CreditsSide | None
    credits_error: str
    last_run: NightlyRun | None


def order_to_credit_latency(*, since: datetime) -> Latency:
    """Return p50 and p99 of order commit to credit commit for the credits awarded since then."""
    awards = credit_award_times(since=since, limit=LATENCY_SAMPLE + 1)
    sampled = len(awards) > LATENCY_SAMPLE
    awards = awards[:LATENCY_SAMPLE]
    ordered_at: dict[int, datetime] = {}
    order_ids = [order_id for order_id, _ in awards]
    for start in range(0, len(order_ids), ID_CHUNK):
        chunk = order_ids[start : start + ID_CHUNK]
        ordered_at.update(Order.objects.filter(pk__in=chunk).values_list("pk", "created_at"))
    # A credit whose order is not here (an orphan, for the nightly check to report) has no latency.
    seconds = sorted(
        (awarded - ordered_at[order_id]).total_seconds() for order_id, awarded in awards if order_id in ordered_at
    )
    return Latency(
        count=len(seconds),
        sampled=sampled,
        p50_seconds=percentile(seconds, 50) if seconds else None,
        p99_seconds=percentile(seconds, 99) if seconds else None,
    )


def credits_side(*, since: datetime, minutes: Minutes) -> CreditsSide:
    """Return the credits service's figures, each read from its own database."""
    return CreditsSide(
        credited_per_minute=credits_per_minute(minutes=minutes),
        latency=order_to_credit_latency(since=since),
        dead_letters_open=dead_letters_open_count(),
    )


def pipeline_read(*, now: datetime | None = None) -> Pipeline:
    """Return every figure of the pipeline page for the hour ending now."""
    now = now or timezone.now()
    since = now - WINDOW
    minutes = Minutes.ending(now)
    orders = Order.objects.all()
    try:
        credits, credits_error = credits_side(since=since, minutes=minutes), ""
    except DatabaseError as exc:
        # The order side is still worth showing: orders keep being taken while the credits database is down.
        logger.warning("pipeline page: the credits database did not answer: %s", exc)
        credits, credits_error = None, f"{type(exc).__name__}: {exc}"
    return Pipeline(
        now=now,
        minutes=minutes,
        orders_last_hour=orders.filter(created_at__gt=since, created_at__lte=now).count(),
        orders_per_minute=counts_per_minute(orders, field="created_at", minutes=minutes),
        outbox=outbox_states(now=now),
        published_per_minute=outbox_published_per_minute(minutes=minutes),
        credits=credits,
        credits_error=credits_error,
        last_run=run_list().first(),
    )

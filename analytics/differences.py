"""The run's extract stages: compare in the databases, then fetch only where the two sides disagree.

Each stage reports through the run's progress what it compared and found (users compared, disagreeing and audited;
the outbox ranges' levels and leaves; the rows fetched), so a run's output shows where its segments led it.
analytics/segments.py (compare, bisect, audit) and analytics/fetch.py (read what disagrees) hold the pieces; this
module orders them and caches what several of them read.
"""

import logging
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from django.conf import settings
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from analytics import extract, fetch, jdbc, segment_sql, segments
from analytics.checks import CheckContext
from analytics.lookups import by_order, count_together

logger = logging.getLogger(__name__)


class Progress(Protocol):
    def stage(self, name: str) -> AbstractContextManager[dict]: ...


@dataclass
class Differences:
    """The fetched rows (an extract of only what disagrees), the reports' aggregates, and the audit's answer."""

    data: extract.Extracted
    aggregates: segments.Aggregates
    audit_mismatches: int


def extract_differences(
    spark: SparkSession,
    sources: jdbc.Sources,
    plan: extract.WindowPlan,
    *,
    ctx: CheckContext,
    progress: Progress,
    audit_users: int | None = None,
) -> Differences:
    """Compare per user and per outbox range in the databases, fetch what disagrees, and audit k users."""
    period = ctx.period
    span = segments.span_of(plan)
    k = settings.ANALYTICS_AUDIT_USERS if audit_users is None else audit_users
    with progress.stage("extract: compare users in the databases") as facts:
        aggregates = segments.read_aggregates(spark, sources, span, period)
        # Cached: each is read once from its database, counted here and used again by the reports.
        for name in ("orders_per_user", "credits_per_user_day", "new_users", "latency"):
            setattr(aggregates, name, getattr(aggregates, name).cache())
        orders_per_user = aggregates.orders_per_user
        from_key = segments.credits_scan_start(sources.credits, span, period)
        credits_sql = segment_sql.credits_per_user(span.low, span.high, from_key)
        credits_per_user = segments.read_sql(spark, sources.credits, credits_sql).cache()
        compared = segments.compare_users(orders_per_user, credits_per_user).cache()
        audited = segments.audit_sample(compared, k=k, seed=segments.audit_seed(period)).cache()
        wanted = compared.where(~F.col("agree")).select("user_id").unionByName(audited).distinct().cache()
        read = {
            "orders_per_user": orders_per_user,
            "credits_per_user": credits_per_user,
            "credits_per_user_day": aggregates.credits_per_user_day,
            "new_users": aggregates.new_users,
            "latency": aggregates.latency,
        }
        counted = count_together({"users": compared, "audited": audited, "fetched": wanted, **read})
        received = sum(counted[name] for name in read)
        facts.update(
            span=f"{span.low}..{span.high}",
            aggregate_rows=received,
            users=counted["users"],
            audited=counted["audited"],
            users_fetched=counted["fetched"],
            credits_read="by key" if from_key is not None else "by order id",
        )
    with progress.stage("extract: compare outbox ranges") as facts:
        leaves = segments.bisect_outbox(spark, sources.orders, span, facts)
        facts["leaves"] = len(leaves)
        received += facts.get("bucket_rows", 0)
    with progress.stage("extract: fetch where they differ") as facts:
        dead_letters = extract.read_open_dead_letters(spark, sources.credits)
        dead_letters = dead_letters.cache()
        fetched = fetch.fetch_differences(
            spark, sources, span, period, users=wanted, leaves=leaves, dead_letter_orders=dead_letters
        )
        data = extract.Extracted(
            orders=by_order(fetched.orders, "id"),
            logs=by_order(fetched.logs, "order_id"),
            credits=by_order(fetched.credits, "order_id"),
            dead_letters=dead_letters,
            first_orders=fetch.empty_first_orders(spark),
            history=extract.read_daily_history(spark, sources.orders),
        )
        recomputed = segments.recompute_users(data.orders, data.credits, span)
        mismatched = segments.audit_mismatches(audited, (orders_per_user, credits_per_user), recomputed)
        counted = count_together(
            {
                "orders": data.orders,
                "credits": data.credits,
                "logs": data.logs,
                "dead_letters": dead_letters,
                "audit": mismatched,
            }
        )
        facts.update({f"{name}_fetched": counted[name] for name in ("orders", "credits", "logs")})
        # Rows the run received from the databases so far (the look-ups' come after; they report what they found).
        facts["rows_received"] = received + sum(counted[n] for n in ("orders", "credits", "logs", "dead_letters"))
        facts["audit_mismatches"] = counted["audit"]
        if counted["audit"]:
            # The checks ran on these users' rows anyway; a mismatch means a checksum no longer says what its rows
            # hold, so the days' other users may hide violations: worth a person's look.
            logger.warning("nightly audit: %d users' checksums disagree with their rows", counted["audit"])
    for df in (compared, audited):
        df.unpersist()
    return Differences(data=data, aggregates=aggregates, audit_mismatches=counted["audit"])

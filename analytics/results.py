"""A run's results as plain Python: the rows collected from Spark arranged per day, and the day's JSON documents.

Nothing here does I/O or touches Spark: jobs.py collects the rows, load.py writes what this module builds.
"""

from dataclasses import dataclass, field
from datetime import date, datetime
from operator import itemgetter

from analytics.checks import CHECK_NAMES, ID_KINDS, CheckContext
from analytics.period import Period
from analytics.repair import RepairResult

SAMPLE_SIZE = 20
METRIC_COLUMNS = (
    "orders",
    "order_units",
    "users",
    "new_users",
    "credited_users",
    "credits_awarded",
    "credits_total",
)


@dataclass
class CheckOutcome:
    count: int = 0
    sample: list = field(default_factory=list)
    # (entity id, detail JSON) of the stored violations, at most ANALYTICS_MAX_STORED_VIOLATIONS.
    rows: list[tuple[str, str]] = field(default_factory=list)
    note: str = ""


@dataclass
class DayResult:
    """Everything the reports say about one day."""

    date: date
    metrics: dict
    distribution: dict
    latency: dict
    credit_histogram: list[dict]
    latency_histogram: list[dict]
    top_users: list[dict]
    trend: list[dict]
    checks: dict[str, CheckOutcome]
    repair: RepairResult | None = None

    @property
    def violations(self) -> int:
        return sum(outcome.count for outcome in self.checks.values())

    @property
    def ok(self) -> bool:
        return self.violations == 0


def day_results(collected: dict[str, list[dict]], *, ctx: CheckContext) -> list[DayResult]:
    """Build one DayResult per day of the checked period from the collected frames (summary, histograms, top users,
    trend, violations).
    """
    analytics = _assemble_analytics(collected)
    outcomes = _assemble_outcomes(collected["violations"], ctx=ctx)
    return [
        DayResult(date=day, checks=outcomes[day], **analytics.get(day, _empty_analytics())) for day in ctx.period.dates
    ]


def consistency_document(day: DayResult, *, run_id: int, ctx: CheckContext, generated_at: datetime) -> dict:
    """consistency.json: docs/CONTRACT.md's date, ok and checks (count and sample ids per name), then context."""
    checks = {}
    for name, outcome in day.checks.items():
        checks[name] = {"count": outcome.count, "sample": outcome.sample}
        if outcome.note:
            checks[name]["note"] = outcome.note
    document = {
        "date": day.date.isoformat(),
        "ok": day.ok,
        "checks": checks,
        "as_of": ctx.as_of,
        "grace_seconds": ctx.grace_seconds,
        "run_id": run_id,
        "generated_at": generated_at,
    }
    if day.repair is not None:
        document["repair"] = day.repair.as_dict()
    return document


def analytics_document(day: DayResult, *, run_id: int, parquet_root: str, generated_at: datetime) -> dict:
    """analytics.json: the day's credit analytics, its 30-day trend, and where the per-user rows went."""
    return {
        "date": day.date.isoformat(),
        **day.metrics,
        "credits_per_user": {**day.distribution, "histogram": day.credit_histogram},
        "award_latency_seconds": {**day.latency, "histogram": day.latency_histogram},
        "top_users": day.top_users,
        "trend": day.trend,
        "per_user_per_day": {
            "mysql_table": "analytics_user_daily_credits",
            "parquet": f"{parquet_root}/user_daily_credits/date={day.date.isoformat()}",
        },
        "run_id": run_id,
        "generated_at": generated_at,
    }


def _assemble_analytics(collected: dict[str, list[dict]]) -> dict[date, dict]:
    """Arrange the collected analytics per day, as plain dicts ready for JSON and templates."""
    by_day: dict[date, dict] = {}
    for values in collected["summary"]:
        by_day[date.fromisoformat(values["date"])] = {
            "metrics": {k: values[k] for k in METRIC_COLUMNS},
            "distribution": {k: values[f"cpu_{k}"] for k in ("p50", "p90", "p99", "max", "mean")}
            | {"users": values["cpu_users"] or 0},
            "latency": {k: values[f"latency_{k}"] for k in ("p50", "p95", "p99", "max")}
            | {"count": values["latency_credits"] or 0},
            "credit_histogram": [],
            "latency_histogram": [],
            "top_users": [],
            "trend": [],
        }
    for row in sorted(collected["credit_histogram"], key=itemgetter("date", "bucket")):
        by_day[date.fromisoformat(row["date"])]["credit_histogram"].append(
            {"lower": row["lower"], "upper": row["upper"], "users": row["users"]}
        )
    for row in sorted(collected["latency_histogram"], key=itemgetter("date", "bucket")):
        by_day[date.fromisoformat(row["date"])]["latency_histogram"].append(
            {"lower": row["lower"], "upper": row["upper"], "credits": row["credits"]}
        )
    for row in sorted(collected["top_users"], key=itemgetter("date", "rank")):
        by_day[date.fromisoformat(row.pop("date"))]["top_users"].append(row)
    for row in sorted(collected["trend"], key=itemgetter("report_date", "date")):
        by_day[date.fromisoformat(row["report_date"])]["trend"].append(
            {"date": row["date"], **{k: row[k] for k in METRIC_COLUMNS}}
        )
    return by_day


def _empty_analytics() -> dict:
    return {
        "metrics": dict.fromkeys(METRIC_COLUMNS, 0),
        "distribution": {"users": 0},
        "latency": {"count": 0},
        "credit_histogram": [],
        "latency_histogram": [],
        "top_users": [],
        "trend": [],
    }


def _assemble_outcomes(violations: list[dict], *, ctx: CheckContext) -> dict[date, dict[str, CheckOutcome]]:
    """Arrange the collected violations per day and check: full count, sample ids, stored rows."""
    outcomes = {day: {name: CheckOutcome() for name in CHECK_NAMES} for day in ctx.period.dates}
    for row in sorted(violations, key=itemgetter("check", "date", "rank")):
        outcome = outcomes[date.fromisoformat(row["date"])][row["check"]]
        outcome.count = row["count"]
        outcome.rows.append((row["entity_id"], row["detail"]))
        if len(outcome.sample) < SAMPLE_SIZE:
            numeric = ID_KINDS[row["check"]] != "transaction"
            outcome.sample.append(int(row["entity_id"]) if numeric else row["entity_id"])
    for day, checks in outcomes.items():
        if ctx.logs_kept_since is not None and Period.ending(day).start < ctx.logs_kept_since:
            checks["order_without_log"].note = (
                f"orders placed before {ctx.logs_kept_since:%Y-%m-%d %H:%M} UTC not judged: published outbox rows "
                f"are deleted after OUTBOX_RETENTION_DAYS={ctx.log_retention_days}"
            )
    return outcomes

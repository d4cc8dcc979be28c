"""End to end: the nightly command reads both databases over JDBC, finds every planted inconsistency, repairs, replaces.

The database rows are committed (transactional tests), because Spark reads them over its own JDBC connections.
Under pytest the orders database and the credits database are two databases (test_<name> and test_<name>_credits),
so every check that pairs orders with credits here is a join of two JDBC sources in Spark.
"""

import json
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db.models import Count, Min, Q, Sum
from django.utils import timezone

from analytics import load
from analytics.checks import CHECK_NAMES
from analytics.models import CheckResult, DailyMetrics, NightlyRun, UserDailyCredits, Violation
from analytics.period import Period
from analytics.runs import run_lock
from credits.models import DeadLetter, OrderCredit
from credits.services import credit_award
from demo.plant import plant_inconsistencies
from demo.seed import seed_demo_data
from orders.models import Order
from outbox.models import TransactionLog

pytestmark = [pytest.mark.spark, pytest.mark.django_db(transaction=True)]

END = timezone.now().date() - timedelta(days=2)
D1, D2, D3 = END - timedelta(days=2), END - timedelta(days=1), END


@pytest.fixture
def history(spark):
    """300 consistent orders over D1..D3 for 15 users, with their published outbox rows and credits."""
    return seed_demo_data(orders=300, days=3, users=15, end=END, seed=11)


@pytest.fixture
def dead_letter():
    """Add a dead-lettered credit message for an order, in the credits database, as the consumer records one."""

    def add(order: Order, status: str) -> int:
        now = timezone.now()
        return DeadLetter.objects.create(
            message_id=order.transaction_id,
            transaction_id=order.transaction_id,
            order_id=order.pk,
            payload={"order_id": order.pk, "user_id": order.user_id, "total": order.total},
            reason=DeadLetter.Reason.UNEXPECTED,
            error="planted by the test",
            attempts=4,
            first_failed_at=now,
            last_failed_at=now,
            status=status,
        ).pk

    return add


def consistency(reports, day) -> dict:
    return json.loads((reports / day.isoformat() / "consistency.json").read_text())


def analytics_json(reports, day) -> dict:
    return json.loads((reports / day.isoformat() / "analytics.json").read_text())


def day_filter(day, field: str = "created_at") -> Q:
    period = Period.ending(day)
    return Q(**{f"{field}__gte": period.start, f"{field}__lt": period.end})


def test_planted_inconsistencies_are_found_exactly_and_a_clean_day_is_ok(reports, history, dead_letter, spark):
    expected = plant_inconsistencies(day=D2, per_kind=3, seed=5)
    # Two of the orders whose credit went missing have an open dead letter; a third was replayed already.
    lost = Order.objects.filter(id__in=expected["missing_credit"][:3]).order_by("id")
    open_letters = sorted([dead_letter(lost[0], "open"), dead_letter(lost[1], "open")])
    dead_letter(lost[2], "replayed")
    expected["dead_letters_open"] = open_letters

    call_command("run_nightly_reports", "--date", str(D3), "--days", "3")

    clean = consistency(reports, D1)
    assert clean["ok"] is True
    assert clean["checks"].keys() >= set(CHECK_NAMES)
    assert all(clean["checks"][name] == {"count": 0, "sample": []} for name in CHECK_NAMES[:-1])

    dirty = consistency(reports, D2)
    assert dirty["ok"] is False
    assert dirty["date"] == str(D2)
    found = {name: (check["count"], check["sample"]) for name, check in dirty["checks"].items()}
    assert found == {name: (len(ids), ids) for name, ids in expected.items()}
    # duplicate_credit cannot be planted: order_credits.order_id is UNIQUE (the check is tested on DataFrames).
    assert found["duplicate_credit"] == (0, [])

    # The same answers are stored in MySQL, with the run.
    run = NightlyRun.objects.get()
    assert (run.status, run.days, run.ok, run.violations) == ("succeeded", 3, False, sum(map(len, expected.values())))
    stored = {r.name: r.sample for r in CheckResult.objects.filter(run=run, date=D2)}
    assert stored == expected
    for name, ids in expected.items():
        rows = Violation.objects.filter(run=run, date=D2, check_name=name)
        assert sorted(rows.values_list("entity_id", flat=True)) == sorted(str(i) for i in ids)
    assert not Violation.objects.filter(run=run, date=D1).exists()


def test_analytics_match_the_database(reports, history, spark):
    call_command("run_nightly_reports", "--date", str(D1))

    report = analytics_json(reports, D1)
    orders = Order.objects.filter(day_filter(D1))
    credits = OrderCredit.objects.filter(day_filter(D1))
    assert report["orders"] == orders.count()
    assert report["order_units"] == orders.aggregate(s=Sum("total"))["s"]
    assert report["users"] == orders.values("user_id").distinct().count()
    assert report["credits_awarded"] == credits.count()
    assert report["credits_total"] == credits.aggregate(s=Sum("amount"))["s"]
    first_ids = Order.objects.values("user_id").annotate(first=Min("id")).values_list("first", flat=True)
    assert report["new_users"] == orders.filter(id__in=list(first_ids)).count()

    per_user = credits.values("user_id").annotate(awarded=Sum("amount"), n=Count("id")).order_by("-awarded", "user_id")
    assert [(u["user_id"], u["credits_total"]) for u in report["top_users"]] == [
        (row["user_id"], row["awarded"]) for row in per_user[:10]
    ]
    assert report["credits_per_user"]["users"] == per_user.count()
    assert sum(b["users"] for b in report["credits_per_user"]["histogram"]) == per_user.count()
    latency = report["award_latency_seconds"]
    assert latency["count"] == credits.filter(order_id__in=list(Order.objects.values_list("id", flat=True))).count()
    assert 0 < latency["p50"] <= latency["p95"] <= latency["p99"] <= latency["max"]
    assert [point["date"] for point in report["trend"]][-1] == str(D1)
    assert len(report["trend"]) == 30

    metrics = DailyMetrics.objects.get(date=D1)
    assert (metrics.orders, metrics.credits_total) == (report["orders"], report["credits_total"])
    assert UserDailyCredits.objects.filter(date=D1).count() == (
        len(set(orders.values_list("user_id", flat=True)) | set(credits.values_list("user_id", flat=True)))
    )
    report_dir = reports / str(D1)
    clean = json.loads((report_dir / "consistency.json").read_text())["ok"]
    # A clean day's report says so in words instead of drawing a violations chart of zeros.
    assert (report_dir / "report.html").read_text().count("data:image/svg+xml;base64,") == (4 if clean else 5)
    assert list((report_dir / "parquet" / "user_daily_credits").glob("*.parquet"))


def test_repair_reenqueues_through_the_outbox_and_a_rerun_is_clean(reports, history, spark, monkeypatch):
    day = Order.objects.filter(day_filter(D3)).order_by("id")
    a, b, c, d, e = list(day[10:15])

    def log(order):
        return TransactionLog.objects.filter(business="order", foreign_key=str(order.pk))

    repaired_ids = [o.pk for o in (a, b, c, d, e)]
    OrderCredit.objects.filter(order_id__in=repaired_ids).delete()
    log(c).delete()  # never written: repair must create its message
    log(d).update(status="pending", published_at=None, attempts=2, next_attempt_at=timezone.now() + timedelta(hours=1))
    log(e).update(status="dead", published_at=None, attempts=10)

    # Count the reports drawn and written (a spy, no fault): with --repair, once each, after the repair.
    calls = []

    def spy(name: str) -> None:
        real = getattr(load, name)

        def counted(day, *args, **kwargs):
            calls.append((name, day.date))
            return real(day, *args, **kwargs)

        monkeypatch.setattr(load, name, counted)

    spy("render_day_files")
    spy("write_day_files")
    call_command("run_nightly_reports", "--date", str(D3), "--repair")
    monkeypatch.undo()
    assert calls == [("render_day_files", D3), ("write_day_files", D3)]
    assert "Re-enqueued 5 messages through the outbox" in (reports / D3.isoformat() / "report.html").read_text()
    # The checks report what the run found, before its repair.
    before = consistency(reports, D3)
    assert before["checks"]["missing_credit"]["sample"] == [a.pk, b.pk, c.pk, d.pk, e.pk]
    assert before["checks"]["order_without_log"]["sample"] == [c.pk]
    assert before["checks"]["stuck_outbox"]["sample"] == sorted([d.transaction_id, e.transaction_id])
    user_rows = UserDailyCredits.objects.filter(date=D3).count()
    assert (reports / "parquet" / "violations" / f"date={D3}").exists()
    repaired = before["repair"]
    assert repaired["reset"] == sorted(o.transaction_id for o in (a, b, d, e))
    assert repaired["created"] == [c.transaction_id]
    assert repaired["reenqueued"] == 5
    # Nothing was awarded: the repair only made messages due, each a pending row the relay will publish now.
    assert not OrderCredit.objects.filter(order_id__in=repaired_ids).exists()
    due = TransactionLog.objects.filter(status="pending", next_attempt_at__lte=timezone.now())
    assert sorted(due.values_list("id", flat=True)) == sorted(o.transaction_id for o in (a, b, c, d, e))
    assert NightlyRun.objects.filter(repair=True).get().reenqueued == 5

    # Stand in for the relay publishing each re-enqueued message and the consumer applying it to the credits database.
    for message in due:
        payload = message.payload
        credit_award(
            transaction_id=message.id,
            order_id=payload["order_id"],
            user_id=payload["user_id"],
            total=payload["total"],
        )
    due.update(status="published", published_at=timezone.now())

    call_command("run_nightly_reports", "--date", str(D3))
    after = consistency(reports, D3)
    assert after["ok"] is True
    assert {name: check["count"] for name, check in after["checks"].items()} == dict.fromkeys(CHECK_NAMES, 0)

    # The rerun replaced the day: one metrics row (from the last run), the same per-user rows, no stale violations.
    last = NightlyRun.objects.order_by("-id").first()
    assert DailyMetrics.objects.filter(date=D3).get().run == last
    assert UserDailyCredits.objects.filter(date=D3).count() == user_rows
    assert not (reports / "parquet" / "violations" / f"date={D3}").exists()
    parquet_rows = spark.read.parquet(str(reports / "parquet" / "user_daily_credits")).where(f"date = '{D3}'")
    assert parquet_rows.count() == user_rows
    assert NightlyRun.objects.filter(status="succeeded").count() == 2


def test_a_second_run_for_the_same_day_is_refused(reports):
    with run_lock(period=Period.ending(D3)), pytest.raises(CommandError, match="in progress"):
        call_command("run_nightly_reports", "--date", str(D3))
    assert not NightlyRun.objects.exists()

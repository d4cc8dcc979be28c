"""/admin/pipeline/: every figure on the page is what the two databases hold, counted here independently."""

import math
import re
from datetime import timedelta
from unittest import mock

import pytest
from django.db import OperationalError
from django.test import Client
from django.utils import timezone

from analytics.models import NightlyRun
from core.stats import percentile
from credits.models import DeadLetter, OrderCredit
from credits.services import dead_letter_record
from credits.tests.support import place_order
from orders.models import Order
from outbox.models import TransactionLog

# Orders commit in their own transaction, as in production: no test case's transaction may hold them.
pytestmark = pytest.mark.usefixtures("committed_db")


def figure(body: str, element_id: str) -> str:
    found = re.search(rf'id="{element_id}"[^>]*>([^<]*)<', body)
    assert found, f"no #{element_id} on the page"
    return found.group(1).strip()


def nearest_rank(values: list[float], fraction: float) -> float:
    return sorted(values)[math.ceil(fraction * len(values)) - 1]


def test_percentile_is_the_nearest_rank():
    hundred = [float(n) for n in range(1, 101)]
    assert [percentile(hundred, p) for p in (1, 7, 50, 99, 100)] == [1.0, 7.0, 50.0, 99.0, 100.0]
    # An even count's median is the lower middle value, never one interpolated between the two.
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 50) == 3.0
    assert percentile([5.0], 0) == percentile([5.0], 99) == 5.0
    assert math.isnan(percentile([], 50))


@pytest.fixture
def busy_hour(user):
    """Orders over the last two hours in every outbox state, their credits at known delays, a dead letter, a run."""
    now = timezone.now()
    created = {}
    for minutes_ago in (130, 61, 59, 30, 12, 12, 3, 0.5):
        order_id, payload = place_order(user=user)
        at = now - timedelta(minutes=minutes_ago)
        Order.objects.filter(pk=order_id).update(created_at=at)
        TransactionLog.objects.filter(pk=payload["transaction_id"]).update(created_at=at, next_attempt_at=at)
        created[order_id] = (at, payload["transaction_id"])
    ids = sorted(created)
    # Published at the order's time plus a second, but one: still due, stuck since 59 minutes ago.
    for order_id in ids[:2] + ids[3:5]:
        at, tx = created[order_id]
        TransactionLog.objects.filter(pk=tx).update(
            status=TransactionLog.Status.PUBLISHED, published_at=at + timedelta(seconds=1)
        )
    TransactionLog.objects.filter(pk=created[ids[5]][1]).update(
        attempts=3, next_attempt_at=now + timedelta(minutes=5), last_error="nacked"
    )
    TransactionLog.objects.filter(pk=created[ids[6]][1]).update(status=TransactionLog.Status.DEAD, attempts=10)
    # Credits: one for an order out of the hour, three within it at known delays, the others not yet credited.
    for order_id, delay in zip(ids[:5], (0.2, 9.0, 0.25, 1.5, 4.0), strict=True):
        OrderCredit.objects.create(
            user_id=user.pk, order_id=order_id, amount=6, created_at=created[order_id][0] + timedelta(seconds=delay)
        )
    dead_letter_record(
        message_id="m" * 32,
        payload={"order_id": ids[7]},
        reason=DeadLetter.Reason.MALFORMED,
        error="test",
        attempts=1,
        first_failed_at=now,
        last_failed_at=now,
    )
    run = NightlyRun.objects.create(
        date=now.date() - timedelta(days=1),
        status=NightlyRun.Status.SUCCEEDED,
        finished_at=now - timedelta(hours=3),
        ok=False,
        violations=3,
    )
    return run


def test_every_figure_matches_the_databases(staff_client, busy_hour):
    response = staff_client.get("/admin/pipeline/")
    now = timezone.now()

    assert response.status_code == 200
    body = response.content.decode()
    hour_ago = now - timedelta(hours=1)
    orders = list(Order.objects.values_list("created_at", flat=True))
    # The page read a moment before `now`: an order exactly on the boundary would be off by one, none is.
    assert int(figure(body, "orders-last-hour")) == sum(hour_ago < at <= now for at in orders) == 6

    rows = list(TransactionLog.objects.all())
    pending = [row for row in rows if row.status == TransactionLog.Status.PENDING]
    due = [row for row in pending if row.next_attempt_at <= now]
    assert int(figure(body, "outbox-due")) == len(due) == 2
    assert int(figure(body, "outbox-backing-off")) == sum(r.next_attempt_at > now and r.attempts > 0 for r in pending)
    assert int(figure(body, "outbox-stuck")) == sum(r.created_at <= now - timedelta(seconds=300) for r in pending) == 2
    assert int(figure(body, "outbox-dead")) == sum(r.status == TransactionLog.Status.DEAD for r in rows) == 1
    oldest = max((now - row.next_attempt_at).total_seconds() for row in due)
    assert abs(float(figure(body, "outbox-oldest-due")) - oldest) < 1.0

    # Order to credit: credits of the last hour, paired with their orders' commit times.
    ordered_at = dict(Order.objects.values_list("pk", "created_at"))
    delays = [
        (credit.created_at - ordered_at[credit.order_id]).total_seconds()
        for credit in OrderCredit.objects.filter(created_at__gte=hour_ago)
    ]
    assert int(figure(body, "latency-count")) == len(delays) == 3
    assert float(figure(body, "latency-p50")) == pytest.approx(nearest_rank(delays, 0.5), abs=0.001) == 1.5
    assert float(figure(body, "latency-p99")) == pytest.approx(nearest_rank(delays, 0.99), abs=0.001) == 4.0
    assert int(figure(body, "dead-letters-open")) == DeadLetter.objects.filter(status=DeadLetter.Status.OPEN).count()

    assert f'href="/reports/runs/{busy_hour.pk}/"' in body
    assert "<strong>3 violations</strong>" in body


def test_the_charts_count_each_minute_of_the_hour(staff_client, busy_hour):
    response = staff_client.get("/admin/pipeline/")
    body = response.content.decode()
    charts = re.findall(r'<svg class="sparkline".*?</svg>', body, flags=re.S)
    assert len(charts) == 3

    def bar_titles(chart: str) -> dict[int, int]:
        return {int(ago): int(n) for ago, n in re.findall(r"<title>(\d+) min ago: (\d+)</title>", chart)}

    # The last bar is the current minute; count each source's rows per minute the same way, here.
    current = timezone.now().replace(second=0, microsecond=0)

    def expected(times) -> dict[int, int]:
        counts = dict.fromkeys(range(60), 0)
        for at in times:
            ago = int((current - at.replace(second=0, microsecond=0)).total_seconds() // 60)
            if 0 <= ago < 60:
                counts[ago] += 1
        return counts

    published = TransactionLog.objects.exclude(published_at=None).values_list("published_at", flat=True)
    assert bar_titles(charts[0]) == expected(Order.objects.values_list("created_at", flat=True))
    assert bar_titles(charts[1]) == expected(published)
    assert bar_titles(charts[2]) == expected(OrderCredit.objects.values_list("created_at", flat=True))
    assert sum(bar_titles(charts[2]).values()) == 3
    assert int(figure(body, "published-total")) == sum(bar_titles(charts[1]).values()) == 2
    assert int(figure(body, "credited-total")) == sum(bar_titles(charts[2]).values())


def test_the_page_refreshes_itself_under_a_csp_that_allows_no_outside_source(staff_client, busy_hour):
    response = staff_client.get("/admin/pipeline/")

    assert '<meta http-equiv="refresh" content="30">' in response.content.decode()
    policy = response["Content-Security-Policy"]
    assert "default-src 'none'" in policy and "http" not in policy and "unsafe-eval" not in policy


def test_the_order_side_is_shown_while_the_credits_database_does_not_answer(staff_client, busy_hour):
    with mock.patch("analytics.pipeline.credits_per_minute", side_effect=OperationalError(2003, "Can't connect")):
        response = staff_client.get("/admin/pipeline/")

    body = response.content.decode()
    assert response.status_code == 200
    assert "the credits database does not answer" in body and "Can&#x27;t connect" in body
    assert int(figure(body, "orders-last-hour")) == 6
    assert 'id="latency-p50"' not in body


def test_the_admin_index_links_the_page(staff_client):
    assert 'href="/admin/pipeline/"' in staff_client.get("/admin/").content.decode()


def test_customers_are_sent_to_the_login_page(make_user):
    client = Client()
    client.force_login(make_user("customer"))
    response = client.get("/admin/pipeline/")
    assert response.status_code == 302 and "/login/" in response["Location"]

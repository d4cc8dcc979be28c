"""The outbox admin: delivery filters, retry now, discard with a reason, and who may do it."""

from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from outbox.models import TransactionLog

Status = TransactionLog.Status
URL = reverse("admin:outbox_transactionlog_changelist")

pytestmark = pytest.mark.django_db


@pytest.fixture
def viewer(make_staff_client) -> Client:
    """Staff who may look at the list but hold no permission to act."""
    return make_staff_client("viewer", "outbox.view_transactionlog")


@pytest.fixture
def states(make_rows) -> dict[str, list[str]]:
    now = timezone.now()
    return {
        "due": make_rows(2),
        "backing_off": make_rows(1, attempts=2, next_attempt_at=now + timedelta(minutes=5), last_error="nacked"),
        "stuck": make_rows(1, created_at=now - timedelta(hours=1), next_attempt_at=now - timedelta(hours=1)),
        "dead": make_rows(1, status=Status.DEAD, attempts=10, last_error="nacked by the broker"),
        "published": make_rows(2, status=Status.PUBLISHED, published_at=now),
    }


def listed_ids(response) -> set[str]:
    return {obj.pk for obj in response.context["cl"].result_list}


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ("due", {"due", "stuck"}),
        ("backing_off", {"backing_off"}),
        ("stuck", {"stuck"}),
        ("dead", {"dead"}),
        ("published", {"published"}),
    ],
)
def test_each_delivery_filter_lists_exactly_its_rows(staff_client, states, choice, expected):
    response = staff_client.get(URL, {"delivery": choice})
    assert response.status_code == 200
    assert listed_ids(response) == {tx for name in expected for tx in states[name]}


def test_the_list_shows_attempts_last_error_and_age_and_finds_a_row_by_order_id(staff_client, states):
    response = staff_client.get(URL)
    assert response.status_code == 200
    assert listed_ids(response) == {tx for ids in states.values() for tx in ids}
    html = response.content.decode()
    assert "nacked by the broker" in html and "Last error" in html and "Age" in html and "Attempts" in html

    row = TransactionLog.objects.get(id=states["dead"][0])
    assert listed_ids(staff_client.get(URL, {"q": row.foreign_key})) == {row.id}
    assert listed_ids(staff_client.get(URL, {"q": row.id})) == {row.id}


def test_retry_now_puts_dead_and_backing_off_rows_back_to_due(staff_client, states):
    chosen = states["dead"] + states["backing_off"] + states["published"]
    response = staff_client.post(URL, {"action": "retry_now", "_selected_action": chosen}, follow=True)
    assert response.status_code == 200
    assert "2 message(s) will be published again shortly" in response.content.decode()
    now = timezone.now()
    for row in TransactionLog.objects.filter(id__in=states["dead"] + states["backing_off"]):
        assert (row.status, row.attempts) == (Status.PENDING, 0) and row.next_attempt_at <= now
    assert set(TransactionLog.objects.filter(id__in=states["published"]).values_list("status", flat=True)) == {
        Status.PUBLISHED
    }


def test_discard_asks_for_a_reason_then_records_it_with_the_operator(staff_client, states):
    chosen = states["dead"]
    form = staff_client.post(URL, {"action": "discard", "_selected_action": chosen})
    assert form.status_code == 200
    assert b'name="reason"' in form.content
    assert TransactionLog.objects.get(id=chosen[0]).status == Status.DEAD

    blank = staff_client.post(URL, {"action": "discard", "_selected_action": chosen, "apply": "yes", "reason": " "})
    assert blank.status_code == 200 and b"This field is required" in blank.content
    assert TransactionLog.objects.get(id=chosen[0]).status == Status.DEAD

    done = staff_client.post(
        URL, {"action": "discard", "_selected_action": chosen, "apply": "yes", "reason": "test order"}, follow=True
    )
    assert "Discarded 1 message(s)" in done.content.decode()
    row = TransactionLog.objects.get(id=chosen[0])
    assert (row.status, row.discarded_reason, row.discarded_by) == (Status.DISCARDED, "test order", "operator")


def test_staff_without_the_manage_permission_can_look_but_not_act(viewer, states):
    response = viewer.get(URL, {"delivery": "dead"})
    assert response.status_code == 200
    assert b"retry_now" not in response.content

    viewer.post(URL, {"action": "retry_now", "_selected_action": states["dead"]})
    viewer.post(URL, {"action": "discard", "_selected_action": states["dead"], "apply": "yes", "reason": "x"})
    assert TransactionLog.objects.get(id=states["dead"][0]).status == Status.DEAD


def test_non_staff_are_sent_to_the_login_page(make_user, states):
    client = Client()
    client.force_login(make_user("customer"))
    response = client.get(URL)
    assert response.status_code == 302 and "/admin/login/" in response["Location"]


def test_filtered_pages_count_at_most_a_capped_number_of_rows(staff_client, states):
    from core.admin import FastCountPaginator

    class SmallCap(FastCountPaginator):
        count_cap = 3

    rows = TransactionLog.objects.order_by("id")
    assert FastCountPaginator(rows, 50).count == 7
    assert SmallCap(rows.filter(attempts__gte=0), 50).count == 4
    assert SmallCap(rows, 50).count >= 4

from urllib.parse import urlencode

import pytest
from django.test import Client
from django.utils import timezone

from credits import services
from credits.models import DeadLetter, OrderCredit
from credits.tests.support import place_order

# Orders commit in their own transaction, as in production: no test case's transaction may hold them.
pytestmark = pytest.mark.usefixtures("committed_db")

URL = "/admin/credits/deadletter/"


def dead_letter(payload: dict, *, reason=DeadLetter.Reason.DEADLOCK) -> DeadLetter:
    now = timezone.now()
    services.dead_letter_record(
        message_id=payload["transaction_id"],
        payload=payload,
        reason=reason,
        error="OperationalError: (1213, 'injected')",
        attempts=4,
        first_failed_at=now,
        last_failed_at=now,
    )
    return DeadLetter.objects.get(message_id=payload["transaction_id"])


@pytest.fixture
def viewer(make_staff_client) -> Client:
    """Staff who may look at the list but hold no permission to act."""
    return make_staff_client("viewer", "credits.view_deadletter")


def act(client: Client, action: str, letters: list[DeadLetter], **extra):
    return client.post(URL, {"action": action, "_selected_action": [d.pk for d in letters], **extra}, follow=True)


def test_the_list_filters_by_status_reason_and_date(staff_client, user):
    dead_letter(place_order(user=user)[1])
    midnight = timezone.now().replace(hour=0, minute=0, second=0, microsecond=0)
    today = urlencode({"last_failed_at__gte": str(midnight)})
    for query in ("", "?status__exact=open", "?reason__exact=deadlock", f"?{today}", "?q=1213"):
        response = staff_client.get(URL + query)
        assert response.status_code == 200, query
        assert response.context["cl"].result_count == 1, query
    assert staff_client.get(URL + "?status__exact=replayed").context["cl"].result_count == 0


def test_replay_awards_once_however_often_it_is_clicked(staff_client, user):
    order_id, payload = place_order(user=user, total=5)
    letter = dead_letter(payload)
    for _ in range(2):
        assert act(staff_client, "replay", [letter]).status_code == 200
    assert OrderCredit.objects.filter(order_id=order_id).count() == 1
    letter.refresh_from_db()
    assert (letter.status, letter.replayed_by) == (DeadLetter.Status.REPLAYED, "operator")


def test_replay_of_many_reports_each_outcome(staff_client, user):
    _, good = place_order(user=user, total=2)
    _, bad = place_order(user=user, total=2)
    letters = [dead_letter(good), dead_letter({**bad, "total": 0}, reason=DeadLetter.Reason.MALFORMED)]
    response = act(staff_client, "replay", letters)
    shown = [str(m) for m in response.context["messages"]]
    assert any("1 awarded" in m and "1 failed again" in m for m in shown)
    assert any("MalformedMessage" in m for m in shown)
    assert [d.status for d in DeadLetter.objects.order_by("pk")] == ["replayed", "open"]


def test_discard_asks_for_a_reason_then_records_it(staff_client, user):
    letter = dead_letter(place_order(user=user)[1])
    form = act(staff_client, "discard", [letter])
    assert b"reason" in form.content
    assert DeadLetter.objects.get().status == DeadLetter.Status.OPEN
    assert act(staff_client, "discard", [letter], apply="1", reason="").status_code == 200
    assert DeadLetter.objects.get().status == DeadLetter.Status.OPEN
    act(staff_client, "discard", [letter], apply="1", reason="test order, no credit due")
    letter.refresh_from_db()
    assert (letter.status, letter.discarded_by, letter.discarded_reason) == (
        DeadLetter.Status.DISCARDED,
        "operator",
        "test order, no credit due",
    )
    assert letter.discarded_at is not None


def test_staff_without_the_permission_can_look_but_not_act(viewer, user):
    letter = dead_letter(place_order(user=user)[1])
    page = viewer.get(URL)
    assert page.status_code == 200
    assert b'value="replay"' not in page.content
    act(viewer, "replay", [letter])
    act(viewer, "discard", [letter], apply="1", reason="no")
    assert DeadLetter.objects.get().status == DeadLetter.Status.OPEN
    assert not OrderCredit.objects.exists()


def test_non_staff_are_sent_to_the_login_page(make_user):
    client = Client()
    client.force_login(make_user("customer"))
    assert client.get(URL).status_code == 302

import pytest
from django.utils import timezone

from core.pagination import MAX_PAGE_SIZE
from credits import services
from credits.models import DeadLetter
from credits.tests.support import place_order
from orders.selectors import order_get

# Orders commit in their own transaction, as in production: no test case's transaction may hold them.
pytestmark = pytest.mark.usefixtures("committed_db")


def award(payload: dict) -> None:
    services.credit_award(
        transaction_id=payload["transaction_id"],
        order_id=payload["order_id"],
        user_id=payload["user_id"],
        total=payload["total"],
    )


def dead_letter(payload: dict) -> DeadLetter:
    now = timezone.now()
    services.dead_letter_record(
        message_id=payload["transaction_id"],
        payload=payload,
        reason=DeadLetter.Reason.DEADLOCK,
        error="x",
        attempts=4,
        first_failed_at=now,
        last_failed_at=now,
    )
    return DeadLetter.objects.get(message_id=payload["transaction_id"])


def status(user, order_id: int) -> str:
    return order_get(user=user, order_id=order_id).credit_status


def test_credit_status_follows_the_award_and_the_dead_letter(user):
    order_id, payload = place_order(user=user)
    assert status(user, order_id) == "pending"
    letter = dead_letter(payload)
    assert status(user, order_id) == "dead_lettered"
    services.dead_letter_replay(dead_letter_id=letter.pk, by="ops")
    assert status(user, order_id) == "awarded"


def test_a_discarded_dead_letter_leaves_the_order_pending(user):
    order_id, payload = place_order(user=user)
    services.dead_letters_discard(dead_letter_ids=[dead_letter(payload).pk], by="ops", reason="fraud")
    assert status(user, order_id) == "pending"


def test_an_awarded_order_stays_awarded_when_another_copy_is_dead_lettered(user):
    order_id, payload = place_order(user=user)
    award(payload)
    dead_letter({**payload, "transaction_id": "e" * 32})
    assert status(user, order_id) == "awarded"


def test_the_orders_api_shows_the_credit_status(api, user):
    order_id, payload = place_order(user=user)
    dead_letter(payload)
    assert api.get(f"/api/orders/{order_id}/").json()["credit_status"] == "dead_lettered"


def test_credits_api_gives_the_balance_and_paginated_entries(api, user, other_user):
    payloads = [place_order(user=user, total=total)[1] for total in (1, 2, 3)]
    for payload in payloads:
        award(payload)
    award(place_order(user=other_user, total=50)[1])
    body = api.get("/api/credits/?limit=2").json()
    assert body["balance"] == 12
    assert body["count"] == 3
    assert [e["order_id"] for e in body["entries"]] == [payloads[2]["order_id"], payloads[1]["order_id"]]
    assert [e["total"] for e in body["entries"]] == [6, 4]
    assert set(body["entries"][0]) == {"order_id", "total", "created_at"}
    rest = api.get(body["next"]).json()
    assert [e["order_id"] for e in rest["entries"]] == [payloads[0]["order_id"]]
    assert rest["next"] is None


def test_credits_api_pages_are_never_larger_than_the_cap(api, user):
    for _ in range(MAX_PAGE_SIZE + 1):
        award(place_order(user=user, total=1)[1])

    refused = api.get("/api/credits/", {"limit": 100_000_000})
    body = api.get("/api/credits/", {"limit": MAX_PAGE_SIZE}).json()

    assert refused.status_code == 400 and "limit" in refused.json()
    assert (body["count"], len(body["entries"])) == (MAX_PAGE_SIZE + 1, MAX_PAGE_SIZE)
    assert body["next"] is not None


def test_credits_api_for_a_user_without_credits(api):
    assert api.get("/api/credits/").json() == {"balance": 0, "count": 0, "next": None, "previous": None, "entries": []}


def test_credits_api_needs_a_token(client):
    assert client.get("/api/credits/").status_code == 401

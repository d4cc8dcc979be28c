import pytest
from django.db import connections
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from core.errors import ReasonRequired
from credits import services
from credits.models import CreditBalance, DeadLetter, OrderCredit
from credits.selectors import credit_balance
from credits.services import ReplayOutcome
from credits.tests.support import place_order

pytestmark = pytest.mark.django_db


def award(payload: dict) -> services.CreditAward:
    return services.credit_award(
        transaction_id=payload["transaction_id"],
        order_id=payload["order_id"],
        user_id=payload["user_id"],
        total=payload["total"],
    )


def record(payload, *, message_id: str | None = None, reason=DeadLetter.Reason.UNEXPECTED, attempts: int = 1) -> None:
    now = timezone.now()
    services.dead_letter_record(
        message_id=message_id or payload["transaction_id"],
        payload=payload,
        reason=reason,
        error="OperationalError: refused",
        attempts=attempts,
        first_failed_at=now,
        last_failed_at=now,
    )


def test_award_writes_twice_the_total_and_the_balance(user):
    order_id, payload = place_order(user=user, total=4)
    result = award(payload)
    assert (result.created, result.amount) == (True, 8)
    credit = OrderCredit.objects.get(order_id=order_id)
    assert (credit.user_id, credit.amount, credit.transaction_id) == (user.pk, 8, payload["transaction_id"])
    assert credit_balance(user_id=user.pk) == 8


def test_the_rows_written_read_back_through_the_orm(user):
    order_id, payload = place_order(user=user, total=4)
    services.credit_balance_ensure(user_id=user.pk)
    created = CreditBalance.objects.get(user_id=user.pk)
    assert created.balance == 0
    before = timezone.now()
    award(payload)

    credit = OrderCredit.objects.get(order_id=order_id)
    balance = CreditBalance.objects.get(user_id=user.pk)
    assert {f.attname: getattr(credit, f.attname) for f in OrderCredit._meta.concrete_fields} == {
        "id": credit.pk,
        "user_id": user.pk,
        "order_id": order_id,
        "amount": 8,
        "transaction_id": payload["transaction_id"],
        "created_at": balance.updated_at,
        "ordered_at": None,  # a version-1 message does not say
    }
    assert {f.attname: getattr(balance, f.attname) for f in CreditBalance._meta.concrete_fields} == {
        "user_id": user.pk,
        "balance": 8,
        "updated_at": credit.created_at,
    }
    assert created.updated_at <= before <= credit.created_at <= timezone.now()


def test_a_second_delivery_changes_nothing(user):
    order_id, payload = place_order(user=user, total=4)
    award(payload)
    again = award(payload)
    assert (again.created, again.amount) == (False, 8)
    assert OrderCredit.objects.filter(order_id=order_id).count() == 1
    assert credit_balance(user_id=user.pk) == 8


def test_another_message_for_the_same_order_changes_nothing(user):
    _, payload = place_order(user=user, total=4)
    award(payload)
    assert not award({**payload, "transaction_id": "f" * 32}).created
    assert credit_balance(user_id=user.pk) == 8


def test_balances_add_up_per_user(user, other_user):
    for total in (1, 2, 3):
        award(place_order(user=user, total=total)[1])
    award(place_order(user=other_user, total=10)[1])
    assert credit_balance(user_id=user.pk) == 12
    assert credit_balance(user_id=other_user.pk) == 20
    assert CreditBalance.objects.count() == 2


def test_the_award_never_touches_the_order_service_database(user):
    _, payload = place_order(user=user, total=3)
    with (
        CaptureQueriesContext(connections["default"]) as orders_side,
        CaptureQueriesContext(connections["credits"]) as credits_side,
    ):
        award(payload)
        award(payload)
    assert orders_side.captured_queries == []
    assert any(query["sql"].startswith("INSERT INTO `order_credits`") for query in credits_side.captured_queries)


def test_a_well_formed_message_is_trusted_even_for_an_order_this_service_cannot_see(user):
    """The consumer cannot check orders (another service's database); the nightly orphan_credit check does."""
    _, payload = place_order(user=user, total=3)
    unknown = {**payload, "order_id": payload["order_id"] + 1000, "total": 7}
    assert (award(unknown).created, award(unknown).amount) == (True, 14)
    assert OrderCredit.objects.get(order_id=unknown["order_id"]).amount == 14
    assert credit_balance(user_id=user.pk) == 14


def test_a_user_without_credits_has_a_zero_balance(user):
    assert credit_balance(user_id=user.pk) == 0


def test_dead_letter_record_keeps_one_row_per_message(user):
    order_id, payload = place_order(user=user)
    record(payload, attempts=4)
    record(payload, attempts=1)
    letter = DeadLetter.objects.get()
    assert (letter.order_id, letter.transaction_id, letter.attempts) == (order_id, payload["transaction_id"], 5)
    assert letter.status == DeadLetter.Status.OPEN
    assert letter.first_failed_at <= letter.last_failed_at


def test_a_discarded_dead_letter_stays_discarded_when_its_message_fails_again(user):
    _, payload = place_order(user=user)
    record(payload)
    services.dead_letters_discard(dead_letter_ids=[DeadLetter.objects.get().pk], by="ops", reason="test order")
    record(payload)
    assert DeadLetter.objects.get().status == DeadLetter.Status.DISCARDED


def test_a_dead_letter_of_an_unreadable_message_keeps_the_raw_payload():
    record(["not", "a", "dict"], message_id="some-id", reason=DeadLetter.Reason.MALFORMED)
    letter = DeadLetter.objects.get()
    assert (letter.payload, letter.order_id, letter.transaction_id) == (["not", "a", "dict"], None, "")


def test_replay_awards_once_and_records_who_and_when(user):
    order_id, payload = place_order(user=user, total=5)
    record(payload, reason=DeadLetter.Reason.DEADLOCK)
    letter = DeadLetter.objects.get()
    assert services.dead_letter_replay(dead_letter_id=letter.pk, by="ops").outcome == ReplayOutcome.AWARDED
    assert services.dead_letter_replay(dead_letter_id=letter.pk, by="ops2").outcome == ReplayOutcome.NOT_OPEN
    letter.refresh_from_db()
    assert (letter.status, letter.replayed_by) == (DeadLetter.Status.REPLAYED, "ops")
    assert letter.replayed_at is not None
    assert OrderCredit.objects.filter(order_id=order_id).count() == 1
    assert credit_balance(user_id=user.pk) == 10


def test_replaying_a_message_already_awarded_closes_it_without_awarding_again(user):
    _, payload = place_order(user=user, total=5)
    award(payload)
    record(payload, reason=DeadLetter.Reason.DEADLOCK)
    result = services.dead_letter_replay(dead_letter_id=DeadLetter.objects.get().pk, by="ops")
    assert result.outcome == ReplayOutcome.ALREADY_AWARDED
    assert DeadLetter.objects.get().status == DeadLetter.Status.REPLAYED
    assert credit_balance(user_id=user.pk) == 10


def test_a_replay_that_fails_again_stays_open_with_the_new_error(user):
    _, payload = place_order(user=user, total=5)
    record({**payload, "total": 0}, attempts=1)
    letter = DeadLetter.objects.get()
    result = services.dead_letter_replay(dead_letter_id=letter.pk, by="ops")
    assert result.outcome == ReplayOutcome.FAILED
    assert "MalformedMessage" in result.error
    letter.refresh_from_db()
    assert (letter.status, letter.attempts, letter.reason) == (DeadLetter.Status.OPEN, 2, DeadLetter.Reason.MALFORMED)
    assert not OrderCredit.objects.exists()


def test_discard_needs_a_reason_and_changes_only_open_rows(user):
    _, first = place_order(user=user)
    _, second = place_order(user=user)
    record(first)
    record(second)
    one, two = DeadLetter.objects.order_by("pk").values_list("pk", flat=True)
    with pytest.raises(ReasonRequired):
        services.dead_letters_discard(dead_letter_ids=[one], by="ops", reason="   ")
    services.dead_letter_replay(dead_letter_id=two, by="ops")
    assert services.dead_letters_discard(dead_letter_ids=[one, two], by="ops", reason="duplicate order") == 1
    discarded = DeadLetter.objects.get(pk=one)
    assert (discarded.status, discarded.discarded_by, discarded.discarded_reason) == (
        "discarded",
        "ops",
        "duplicate order",
    )
    assert DeadLetter.objects.get(pk=two).status == DeadLetter.Status.REPLAYED

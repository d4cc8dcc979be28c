import pytest
from django.db import ProgrammingError, connections, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from core.errors import ReasonRequired
from credits import services
from credits.models import CreditBalance, DeadLetter, OrderCredit
from credits.selectors import credit_balance
from credits.services import ReplayOutcome
from credits.tests.support import place_order
from testkit.db_faults import rollback_refused
from testkit.round_trips import round_trips, statement_heads

# The award runs as a worker runs it, in its own transaction: no test case's transaction holds it (nor the order).
pytestmark = pytest.mark.usefixtures("committed_db")


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
    with round_trips(connections["default"]) as orders_side, round_trips(connections["credits"]) as credits_side:
        award(payload)
        award(payload)
    assert orders_side == []
    assert any("INSERT INTO `order_credits`" in sql for sql in credits_side)


# --- the award's one-round-trip transaction (award_batch), outside any caller's transaction, as a worker runs it ---


def credits_in_transaction() -> bool:
    """Return whether the credits connection has a transaction open (MariaDB's @@in_transaction)."""
    with connections["credits"].cursor() as cursor:
        cursor.execute("SELECT @@in_transaction")
        return bool(cursor.fetchone()[0])


def balance_read_elsewhere(user_id: int) -> int | None:
    """Return the committed balance, read on a connection of its own (None without a balance row)."""
    connection = connections.create_connection("credits")
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT balance FROM credit_balances WHERE user_id = %s", [user_id])
            row = cursor.fetchone()
    finally:
        connection.close()
    return row and row[0]


def test_an_award_is_one_round_trip_once_the_user_has_a_balance_row(user):
    first, second = (place_order(user=user, total=total)[1] for total in (2, 5))
    with round_trips(connections["credits"]) as new_user:
        award(first)
    # The first award finds no balance row: the batch writes nothing, the row is created, the batch runs again.
    assert [statement_heads(sql) for sql in new_user] == [
        ["START", "UPDATE", "INSERT INTO `order_credits`", "COMMIT"],
        ["INSERT INTO `credit_balances`"],
        ["START", "UPDATE", "INSERT INTO `order_credits`", "COMMIT"],
    ]
    with round_trips(connections["credits"]) as known_user:
        assert award(second).created
    assert [statement_heads(sql) for sql in known_user] == [
        ["START", "UPDATE", "INSERT INTO `order_credits`", "COMMIT"]
    ]
    assert not credits_in_transaction()
    assert balance_read_elsewhere(user.pk) == 14
    assert sorted(OrderCredit.objects.filter(user_id=user.pk).values_list("amount", flat=True)) == [4, 10]


def test_a_duplicate_delivery_rolls_back_its_balance_change(user):
    order_id, payload = place_order(user=user, total=4)
    award(payload)
    again = award(payload)
    assert (again.created, again.amount) == (False, 8)
    assert not credits_in_transaction()
    assert balance_read_elsewhere(user.pk) == 8
    assert OrderCredit.objects.filter(order_id=order_id).count() == 1


@pytest.mark.parametrize("after", ["balance update", "credit insert"])
def test_a_failure_between_the_statements_of_the_batch_rolls_everything_back(user, monkeypatch, after):
    _, earlier = place_order(user=user, total=1)
    award(earlier)
    order_id, payload = place_order(user=user, total=4)
    batch = services.award_batch(own_transaction=True).sql
    statement = services.BALANCE_ADD.sql if after == "balance update" else services.CREDIT_INSERT.sql
    # A statement that fails when it runs, injected into the one round trip right after `after` succeeded.
    failing = batch.replace(f"{statement};", f"{statement};\nSELECT * FROM credit_test_no_such_table;")
    assert failing != batch
    monkeypatch.setattr(services, "award_batch", lambda *, own_transaction: failing)

    with pytest.raises(ProgrammingError, match="credit_test_no_such_table"):
        award(payload)
    assert not credits_in_transaction()
    assert balance_read_elsewhere(user.pk) == 2
    assert not OrderCredit.objects.filter(order_id=order_id).exists()

    monkeypatch.undo()
    assert award(payload).created
    assert balance_read_elsewhere(user.pk) == 10


def test_when_the_rollback_itself_fails_the_connection_is_closed_and_the_server_undoes_the_award(user, monkeypatch):
    _, earlier = place_order(user=user, total=1)
    award(earlier)
    order_id, payload = place_order(user=user, total=4)
    connection = connections["credits"]
    batch = services.award_batch(own_transaction=True).sql
    failing = batch.replace("COMMIT", "SELECT * FROM credit_test_no_such_table;\nCOMMIT")
    monkeypatch.setattr(services, "award_batch", lambda *, own_transaction: failing)
    rollback_refused(monkeypatch, connection)

    with pytest.raises(ProgrammingError):
        award(payload)
    assert connection.connection is None
    assert balance_read_elsewhere(user.pk) == 2
    assert not OrderCredit.objects.filter(order_id=order_id).exists()


def test_inside_a_callers_transaction_the_award_uses_a_savepoint_and_leaves_the_transaction_open(user):
    _, payload = place_order(user=user, total=4)
    services.credit_balance_ensure(user_id=user.pk)
    with transaction.atomic(using="credits"):
        with CaptureQueriesContext(connections["credits"]) as queries:
            award(payload)
            assert not award(payload).created  # the duplicate undoes its own balance change only
        assert credits_in_transaction()
        assert credit_balance(user_id=user.pk) == 8
    # Each award: a savepoint, the two statements in one round trip, the savepoint released (or rolled back to).
    assert [statement_heads(query["sql"]) for query in queries.captured_queries] == [
        ["SAVEPOINT"],
        ["UPDATE", "INSERT INTO `order_credits`"],
        ["RELEASE"],
        ["SAVEPOINT"],
        ["UPDATE", "INSERT INTO `order_credits`"],
        ["ROLLBACK"],
        ["RELEASE"],
        ["SELECT"],
    ]


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

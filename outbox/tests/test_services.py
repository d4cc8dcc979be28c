"""The operator's writes: retry now and discard, each one guarded UPDATE."""

from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from core.errors import ReasonRequired
from outbox.models import TransactionLog
from outbox.services import message_create, messages_discard, messages_retry_now

Status = TransactionLog.Status

pytestmark = pytest.mark.django_db


def test_the_message_written_reads_back_through_the_orm_as_the_returned_object():
    with transaction.atomic():
        returned = message_create(
            transaction_id="0" * 31 + "1", business="order", foreign_key="42", payload={"order_id": 42, "n": "é"}
        )

    stored = TransactionLog.objects.get(pk=returned.pk)
    fields = [field.attname for field in TransactionLog._meta.concrete_fields]
    assert [getattr(stored, f) for f in fields] == [getattr(returned, f) for f in fields]
    assert (stored.status, stored.attempts, stored.published_at, stored.last_error) == (Status.PENDING, 0, None, "")
    assert (stored.discarded_reason, stored.discarded_by) == ("", "")
    assert stored.payload == {"schema_version": 1, "transaction_id": "0" * 31 + "1", "order_id": 42, "n": "é"}
    assert (returned._state.adding, returned._state.db) == (False, stored._state.db)


def test_retry_now_sends_pending_dead_and_discarded_rows_back_due_now(make_rows):
    later = timezone.now() + timedelta(hours=1)
    backing_off = make_rows(1, attempts=4, next_attempt_at=later, last_error="nacked")
    dead = make_rows(1, status=Status.DEAD, attempts=10)
    discarded = make_rows(1, status=Status.DISCARDED, discarded_reason="test order", discarded_by="ops")
    published = make_rows(1, status=Status.PUBLISHED, published_at=timezone.now())

    before = timezone.now()
    assert messages_retry_now(ids=backing_off + dead + discarded + published) == 3

    for row in TransactionLog.objects.filter(id__in=backing_off + dead + discarded):
        assert (row.status, row.attempts, row.discarded_reason) == (Status.PENDING, 0, "")
        assert before <= row.next_attempt_at <= timezone.now()
    assert TransactionLog.objects.get(id=backing_off[0]).last_error == "nacked"  # the history stays readable
    assert TransactionLog.objects.get(id=published[0]).status == Status.PUBLISHED
    assert messages_retry_now(ids=[]) == 0


def test_discard_records_reason_and_actor_and_leaves_published_rows_alone(make_rows):
    pending = make_rows(1)
    dead = make_rows(1, status=Status.DEAD)
    published = make_rows(1, status=Status.PUBLISHED, published_at=timezone.now())

    assert messages_discard(ids=pending + dead + published, reason="  fraud order  ", actor="alice") == 2

    for row in TransactionLog.objects.filter(id__in=pending + dead):
        assert (row.status, row.discarded_reason, row.discarded_by) == (Status.DISCARDED, "fraud order", "alice")
    assert TransactionLog.objects.get(id=published[0]).status == Status.PUBLISHED


def test_discard_needs_a_reason(make_rows):
    ids = make_rows(1)
    with pytest.raises(ReasonRequired):
        messages_discard(ids=ids, reason="   ", actor="alice")
    assert TransactionLog.objects.get(id=ids[0]).status == Status.PENDING

"""purge_dead_letters: resolved dead letters past the retention go, open ones and recent ones stay."""

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from credits.models import DeadLetter
from credits.services import dead_letters_purge_resolved

pytestmark = pytest.mark.django_db


def letter(message_id: str, *, age_days: int, status: str = DeadLetter.Status.OPEN) -> DeadLetter:
    at = timezone.now() - timedelta(days=age_days)
    resolved = {
        DeadLetter.Status.REPLAYED: {"replayed_at": at, "replayed_by": "ops"},
        DeadLetter.Status.DISCARDED: {"discarded_at": at, "discarded_by": "ops", "discarded_reason": "test"},
    }.get(status, {})
    return DeadLetter.objects.create(
        message_id=message_id,
        payload={},
        reason=DeadLetter.Reason.MALFORMED,
        error="x",
        attempts=1,
        first_failed_at=at,
        last_failed_at=at,
        status=status,
        **resolved,
    )


def test_purge_deletes_only_resolved_dead_letters_older_than_the_retention():
    letter("old-replayed", age_days=91, status=DeadLetter.Status.REPLAYED)
    letter("old-discarded", age_days=200, status=DeadLetter.Status.DISCARDED)
    letter("recent-replayed", age_days=10, status=DeadLetter.Status.REPLAYED)
    letter("old-open", age_days=400)
    out = StringIO()

    call_command("purge_dead_letters", "--days", "90", stdout=out)

    assert out.getvalue().strip() == "deleted 2"
    assert sorted(DeadLetter.objects.values_list("message_id", flat=True)) == ["old-open", "recent-replayed"]


def test_purge_refuses_a_retention_under_a_day():
    with pytest.raises(CommandError, match="--days"):
        call_command("purge_dead_letters", "--days", "0")


def test_purge_goes_on_batch_after_batch():
    for i in range(3):
        letter(f"old-{i}", age_days=100, status=DeadLetter.Status.DISCARDED)

    assert dead_letters_purge_resolved(resolved_before=timezone.now() - timedelta(days=90), batch_size=2) == 3
    assert not DeadLetter.objects.exists()

"""Writes to the outbox: adding a message inside the caller's transaction, and waking the relay on commit."""

from django.db import transaction

from outbox.models import TransactionLog

SCHEMA_VERSION = 1


def message_create(*, transaction_id: str, business: str, foreign_key: str, payload: dict) -> TransactionLog:
    """Insert one outbox row in the current transaction and wake the relay once that transaction commits."""
    message = TransactionLog.objects.create(
        id=transaction_id,
        business=business,
        foreign_key=foreign_key,
        payload={"schema_version": SCHEMA_VERSION, "transaction_id": transaction_id, **payload},
    )
    transaction.on_commit(wake_relay, robust=True)
    return message


def wake_relay() -> None:
    """Ask a relay to publish what is due now; the one on-commit hook point of the outbox."""

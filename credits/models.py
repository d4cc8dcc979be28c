"""Credits: one row per credited order, a running balance per user, and the messages that could not be applied.

These tables live in the credits service's own database (config/routers.py). Users and orders live in the order
service's database, so they are referred to by plain ids: no foreign key, no join, no query across.

No field here has a database default (``db_default``): Django asks the *default* connection whether an insert can
return such columns (``Field.db_returning``), so an ORM insert into these tables would connect to the order
service's database, which a credits worker may not log in to (tests/test_two_databases.py).
"""

from django.db import models
from django.utils import timezone

from core.models import trace_context_fields


class OrderCredit(models.Model):
    user_id = models.BigIntegerField(db_index=True)
    # The UNIQUE index on order_id is what makes a redelivered message a no-op. The order itself is in the other
    # service's database: a credit whose order does not exist is what the nightly orphan_credit check finds.
    order_id = models.BigIntegerField(unique=True)
    # The credits awarded: 2 x the order's total (stored in the `total` column docs/CONTRACT.md names).
    amount = models.PositiveIntegerField(db_column="total")
    transaction_id = models.CharField(max_length=32, db_collation="ascii_bin", blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    # When the order was placed, as its message says (version 2 on, core/contract.py); null for a credit awarded from a
    # version-1 message. Order-to-credit latency is created_at - ordered_at, read from this table alone.
    ordered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "order_credits"
        indexes = [
            # The credits of the orders placed in a period (the nightly latency by order day), without the orders'
            # database. Built online: credits/migrations/0005 says how.
            models.Index(fields=["ordered_at"], name="order_credits_ordered_at_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.amount} credits for order {self.order_id}"


class CreditBalance(models.Model):
    """A user's running credit total, always equal to the sum of that user's order_credits rows.

    Written only by credits.services.credit_award, in the same transaction as the order_credits row it adds.
    """

    user_id = models.BigIntegerField(primary_key=True)
    balance = models.PositiveBigIntegerField(default=0)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        db_table = "credit_balances"

    def __str__(self) -> str:
        return f"{self.balance} credits for user {self.user_id}"


class DeadLetter(models.Model):
    """A credits message that failed for good: what it said, why it failed, and what an operator did about it.

    The broker keeps a copy in the credits.dead queue; this row is the operator's worklist and audit trail.
    """

    class Status(models.TextChoices):
        OPEN = "open", "open"
        REPLAYED = "replayed", "replayed"
        DISCARDED = "discarded", "discarded"

    class Reason(models.TextChoices):
        # Permanent: retrying the same message cannot succeed.
        MALFORMED = "malformed", "malformed message"
        UNSUPPORTED_SCHEMA = "unsupported_schema", "unsupported schema version"
        # Newer than this consumer accepts, and no consumer that knows it took it within
        # CREDITS_UNKNOWN_VERSION_WAIT_SECONDS (until then it goes back to the queue, spending no retry).
        VERSION_NOT_SUPPORTED = "version_not_supported", "version not supported (waited for a newer consumer)"
        # Not known to be permanent: dead-lettered only after the last retry.
        UNEXPECTED = "unexpected", "unexpected error"
        DEADLOCK = "deadlock", "deadlock"
        LOCK_WAIT_TIMEOUT = "lock_wait_timeout", "lock wait timeout"
        DATABASE_UNAVAILABLE = "database_unavailable", "database unavailable"

    # The broker message id (the Celery task id), which the relay sets to the transaction id.
    message_id = models.CharField(max_length=255, unique=True, db_collation="utf8mb4_bin")
    # Parsed from the payload where possible; blank or null when the message was too broken to say.
    transaction_id = models.CharField(max_length=32, db_collation="ascii_bin", blank=True, default="")
    order_id = models.BigIntegerField(null=True, blank=True)
    payload = models.JSONField()
    reason = models.CharField(max_length=32, choices=Reason.choices)
    error = models.TextField()
    attempts = models.PositiveIntegerField()
    first_failed_at = models.DateTimeField()
    last_failed_at = models.DateTimeField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.OPEN)
    replayed_at = models.DateTimeField(null=True, blank=True)
    replayed_by = models.CharField(max_length=150, blank=True, default="")
    discarded_at = models.DateTimeField(null=True, blank=True)
    discarded_by = models.CharField(max_length=150, blank=True, default="")
    discarded_reason = models.TextField(blank=True, default="")
    # The trace context the message arrived in (the order request's trace), so a replay's span can link to it.
    traceparent, tracestate = trace_context_fields(db_default=False)

    class Meta:
        db_table = "credit_dead_letters"
        permissions = [("replay_deadletter", "Can replay or discard dead-lettered credit messages")]
        indexes = [
            # The admin's default view and the nightly dead_letters_open check: open rows, newest failure first.
            models.Index(fields=["status", "last_failed_at"], name="credit_dead_letters_status_idx"),
            # An order's credit_status asks "is there an open dead letter for this order?".
            models.Index(fields=["order_id", "status"], name="credit_dead_letters_order_idx"),
        ]

    def __str__(self) -> str:
        return f"dead letter {self.message_id} ({self.status})"

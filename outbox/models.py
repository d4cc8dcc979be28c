"""The transaction_log table: each row is one outbox message and its delivery state."""

from django.db import models
from django.utils import timezone

from core.models import trace_context_fields


class TransactionLog(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending", "pending"
        PUBLISHED = "published", "published"
        DEAD = "dead", "dead"
        DISCARDED = "discarded", "discarded"

    # Time-ordered hex id (see outbox.ids), so inserts append to the clustered index instead of splitting pages.
    id = models.CharField(max_length=32, primary_key=True, db_collation="ascii_bin")
    business = models.CharField(max_length=32)
    foreign_key = models.CharField(max_length=64)
    payload = models.JSONField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    # The delivery columns start at database defaults too: the order request's plain INSERT leaves them out.
    attempts = models.PositiveIntegerField(default=0, db_default=0)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    published_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="", db_default="")
    created_at = models.DateTimeField(default=timezone.now)
    discarded_reason = models.TextField(blank=True, default="", db_default="")
    discarded_by = models.CharField(max_length=150, blank=True, default="", db_default="")
    # The trace context of the request that wrote the row, so the consumer's spans join that request's trace.
    traceparent, tracestate = trace_context_fields()

    class Meta:
        db_table = "transaction_log"
        constraints = [
            # One message per business object: a repair resets this row rather than adding a second one.
            models.UniqueConstraint(fields=["business", "foreign_key"], name="transaction_log_business_fk_uniq"),
        ]
        indexes = [
            # "What is due now" is a range scan on (status='pending', next_attempt_at <= now); InnoDB appends the id.
            models.Index(fields=["status", "next_attempt_at"], name="transaction_log_due_idx"),
            # Retention deletes published rows by age without touching the rest.
            models.Index(fields=["status", "published_at"], name="transaction_log_retention_idx"),
            models.Index(fields=["created_at"], name="transaction_log_created_idx"),
        ]
        permissions = [("manage_outbox", "Can retry and discard outbox messages")]

    def __str__(self) -> str:
        return f"{self.business}:{self.foreign_key} ({self.status})"

"""Celery tasks of the orders app (queue ``outbox``, with the other retention jobs): expire idempotency keys."""

import logging
from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from core.contract import PURGE_IDEMPOTENCY_KEYS_TASK
from core.retention import PURGE_MAX_BATCHES
from orders.services import idempotency_keys_purge

logger = logging.getLogger(__name__)


@shared_task(name=PURGE_IDEMPOTENCY_KEYS_TASK, ignore_result=True)
def purge_idempotency_keys() -> int:
    """Delete idempotency keys older than IDEMPOTENCY_KEY_RETENTION_HOURS, in small batches."""
    deleted = idempotency_keys_purge(
        older_than=timezone.now() - timedelta(hours=settings.IDEMPOTENCY_KEY_RETENTION_HOURS),
        batch_size=settings.OUTBOX_RETENTION_BATCH_SIZE,
        max_batches=PURGE_MAX_BATCHES,
    )
    if deleted:
        logger.info(
            "orders: purged %d idempotency keys older than %d hours", deleted, settings.IDEMPOTENCY_KEY_RETENTION_HOURS
        )
    return deleted

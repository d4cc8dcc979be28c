"""Celery tasks of the orders app (queue ``outbox``, with the other retention jobs): expire idempotency keys."""

import logging
from datetime import timedelta

from celery import shared_task
from django.conf import settings

from core.contract import PURGE_IDEMPOTENCY_KEYS_TASK
from core.retention import scheduled_purge
from orders.services import idempotency_keys_purge

logger = logging.getLogger(__name__)


@shared_task(name=PURGE_IDEMPOTENCY_KEYS_TASK, ignore_result=True)
def purge_idempotency_keys() -> int:
    """Delete idempotency keys older than IDEMPOTENCY_KEY_RETENTION_HOURS, in small batches."""
    return scheduled_purge(
        idempotency_keys_purge,
        keep=timedelta(hours=settings.IDEMPOTENCY_KEY_RETENTION_HOURS),
        rows="idempotency keys",
        log=logger,
    )

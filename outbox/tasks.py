"""Celery tasks of the outbox (queue ``outbox``): relay on wake-up, sweep on a beat, purge old published rows."""

import logging
import os
import threading
from datetime import timedelta

from celery import shared_task
from django.conf import settings

from core.contract import PURGE_PUBLISHED_TASK, RELAY_TASK, SWEEP_TASK
from core.retention import scheduled_purge
from outbox.drain import BrokerUnavailable, drain
from outbox.outage import OutageLog
from outbox.publisher import Publisher
from outbox.services import messages_purge_published

logger = logging.getLogger(__name__)

# A relay task gives its worker process back after this long; what is still due goes to the next wake-up or sweep.
RELAY_TIME_BUDGET_SECONDS = 30.0

_local = threading.local()
_outage = OutageLog("broker (relay task)", log=logger)


def _worker_publisher() -> Publisher:
    """Return this worker process's (or thread's, under -P threads) publisher, kept connected across tasks."""
    if getattr(_local, "pid", None) != os.getpid():
        _local.publisher, _local.pid = Publisher(), os.getpid()
    return _local.publisher


def _relay() -> int:
    try:
        published = drain(_worker_publisher(), time_budget=RELAY_TIME_BUDGET_SECONDS)
    except BrokerUnavailable as exc:
        # No retry from here: the next wake-up or sweep tries again, and the outage is logged once, not per task.
        _outage.failed(exc)
        return exc.published
    _outage.recovered()
    return published


@shared_task(name=RELAY_TASK, ignore_result=True)
def relay() -> int:
    """Publish what is due now; sent on commit of each order (coalesced)."""
    return _relay()


@shared_task(name=SWEEP_TASK, ignore_result=True)
def sweep() -> int:
    """Publish what is due now; run by beat every OUTBOX_SWEEP_SECONDS as the safety net for lost wake-ups."""
    return _relay()


@shared_task(name=PURGE_PUBLISHED_TASK, ignore_result=True)
def purge_published() -> int:
    """Delete rows published more than OUTBOX_RETENTION_DAYS ago, in small batches."""
    return scheduled_purge(
        messages_purge_published,
        keep=timedelta(days=settings.OUTBOX_RETENTION_DAYS),
        rows="published rows",
        log=logger,
    )

"""The Celery app: RabbitMQ broker, the outbox, credits and analytics queues, and delivery guarantees.

Every Celery setting lives here, each with the reason for it, so the delivery semantics can be read in one place.
What runs inside a worker around the tasks (boot steps, database checks, tracing, log context) is core/worker.py.
"""

import os
import socket

from celery import Celery, signals
from kombu import Exchange, Queue

from core.celery_publish import time_limits_left_to_workers
from core.contract import (
    ANALYTICS_QUEUE,
    CREDITS_DEAD_EXCHANGE,
    CREDITS_DEAD_QUEUE,
    CREDITS_QUEUE,
    OUTBOX_QUEUE,
    QUEUE_TYPE_QUORUM,
)
from core.credits_queues import credits_queues
from core.env import env_float, env_int

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

# Deadlines of every broker connection Celery opens (the workers', beat's, and the producers' the relay and the
# web's wake-ups build on), so that a broker gone silent (packets dropped, no reset) is found out, and found out by
# the broker too (docs/OPERATIONS.md, "When the broker goes silent"). A worker consuming through Celery's event loop
# (prefork, whose parent process ticks the heartbeat whatever its pool runs) writes a frame every third of it and
# gives a connection up after two heartbeats without a frame; RabbitMQ gives it up after two to three. A solo worker
# negotiates no heartbeat (Celery ticks none outside its event loop): the keepalive below finds its connection.
# The environment variables of the same names exist for the fault-injection tests, which shorten these deadlines in
# the processes they start so that a silence crosses them in seconds; production keeps the defaults.
BROKER_HEARTBEAT_SECONDS = env_int("BROKER_HEARTBEAT_SECONDS", 10, minimum=2)
# Connecting (TCP), and each blocking read or write afterwards (a handshake, a declare, a publisher confirm):
# milliseconds when the broker is well.
BROKER_CONNECT_TIMEOUT_SECONDS = 4.0
BROKER_SOCKET_TIMEOUT_SECONDS = env_float("BROKER_SOCKET_TIMEOUT_SECONDS", 10.0, minimum=1.0)
# A connection idle this long is probed; py-amqp's TCP_USER_TIMEOUT (1 s) then drops it at the next probe, ten
# seconds on (TCP_KEEPINTVL), when the first went unanswered. py-amqp's own default waits 60 s before the first.
BROKER_KEEPALIVE_IDLE_SECONDS = env_int("BROKER_KEEPALIVE_IDLE_SECONDS", 10, minimum=1)

# Every task derives from core.worker.WorkerTask: the per-task database checks as a call around the run.
app = Celery("creditshop", task_cls="core.worker:WorkerTask")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.update(
    # JSON only: messages are read by other services and by people in the dead-letter queue.
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    # No result backend: the database rows are the results.
    task_ignore_result=True,
    # The broker confirms every publish, so a publish that returned reached the broker.
    broker_transport_options={
        "confirm_publish": True,
        "read_timeout": BROKER_SOCKET_TIMEOUT_SECONDS,
        "write_timeout": BROKER_SOCKET_TIMEOUT_SECONDS,
        "socket_settings": {socket.TCP_KEEPIDLE: BROKER_KEEPALIVE_IDLE_SECONDS},
    },
    broker_heartbeat=BROKER_HEARTBEAT_SECONDS,
    broker_connection_timeout=BROKER_CONNECT_TIMEOUT_SECONDS,
    broker_connection_retry_on_startup=True,
    # A worker retries the broker for as long as it is away (every 5 s at most: core/worker.py): Celery's default
    # gives up after 100 tries and exits, which with short waits comes within minutes of a partition.
    broker_connection_max_retries=None,
    # Beat's scheduler: Celery's file-backed one, whose goodbye to the broker on SIGTERM cannot hang (core/beat.py).
    beat_scheduler="core.beat:Scheduler",
    # Ack after the task ran, and requeue when the worker process dies mid-task: at-least-once delivery,
    # made exactly-once in effect by the consumer's UNIQUE order_id.
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    # Tasks are short database transactions. Eight messages in hand per process keep the pipe full: with four, a solo
    # credits worker waited on the broker between awards and drained 609 awards/s instead of 1,410 (bench_credits.py).
    # A process that dies strands at most that many unacked messages, which the broker redelivers.
    worker_prefetch_multiplier=8,
    # Keep each worker process's database connection from task to task: Celery's Django fixup otherwise opens a
    # new one for every task, about a millisecond of a two-millisecond credit award. The task_prerun/task_postrun
    # handlers in core/worker.py keep reuse safe, and its django_fixup_per_task_skip takes the fixup's own per-task
    # handlers out altogether; this stays for a Celery whose fixup they fail to find. (Read by celery.fixups.django
    # under this old-style name.)
    CELERY_DB_REUSE_MAX=10_000,
    # A worker's control queue (its pidbox, for ping, inspect, revoke) is not exclusive to one connection: a worker
    # that found its connection dead reconnects while the broker, not knowing yet, still holds the old one, and an
    # exclusive queue held by it made the declaration fail with RESOURCE_LOCKED, which Celery treats as unrecoverable:
    # the worker exited. Until the broker lets go (heartbeats, or never for a solo worker's, which has none), the
    # queue has two consumers and a control message may go to the dead one; the queue still goes away with its
    # last consumer (auto-delete), and control_queue_expires after that.
    control_queue_exclusive=False,
    # Celery's consumer, but setting up native delayed delivery (quorum queues) once per cluster (core/worker.py).
    worker_consumer="core.worker:ClusterConsumer",
    task_default_queue=OUTBOX_QUEUE,
    task_create_missing_queues=False,
    # task_queues: set by queues_configure below, once the Django settings it depends on are loaded.
    task_routes={
        "outbox.*": {"queue": OUTBOX_QUEUE},
        # The order service's housekeeping (idempotency key retention) runs beside the outbox's retention.
        "orders.*": {"queue": OUTBOX_QUEUE},
        "credits.*": {"queue": CREDITS_QUEUE},
        "analytics.*": {"queue": ANALYTICS_QUEUE},
    },
    timezone="UTC",
    enable_utc=True,
)


def task_queues(*, queue_type: str, max_retries: int) -> tuple[Queue, ...]:
    """Return the outbox, credits (one queue per message version, credits.expired), credits.dead and analytics queues,
    declared as `queue_type` (CELERY_QUEUE_TYPE).

    classic: one node, direct exchanges, and a retry's delay held by the worker (an ETA task in memory).
    quorum: replicated on a majority of a cluster's nodes (Raft), so a publisher confirm means a majority has the
    message. Their exchanges are topic exchanges because Celery's native delayed delivery, which holds a retry's
    delay in the broker (celery_delayed_* queues, bound by the worker at start), skips direct exchanges.
    Dead-lettering is at-least-once (the dead letter is confirmed by its target before the original is dropped;
    RabbitMQ requires overflow reject-publish for it), and the delivery limit agrees with CREDITS_MAX_RETRIES:
    a message redelivered more than max_retries times (its workers died holding it) is dead-lettered by the consumer
    with its DeadLetter row (credits/tasks.py), and by the broker itself, still never dropped, if even that delivery
    kills its worker. The credits queues, and why there is one per version: core/credits_queues.py.
    """
    quorum = queue_type == QUEUE_TYPE_QUORUM
    exchange_type = "topic" if quorum else "direct"
    common_arguments = {"x-queue-type": QUEUE_TYPE_QUORUM} if quorum else None
    return (
        Queue(
            OUTBOX_QUEUE,
            Exchange(OUTBOX_QUEUE, type=exchange_type, durable=True),
            routing_key=OUTBOX_QUEUE,
            queue_arguments=common_arguments,
        ),
        # A rejected (not requeued) credits message is routed by the broker itself to credits.dead.
        *credits_queues(queue_type=queue_type, max_retries=max_retries),
        Queue(
            CREDITS_DEAD_QUEUE,
            Exchange(CREDITS_DEAD_EXCHANGE, type="direct", durable=True),
            routing_key=CREDITS_DEAD_QUEUE,
            queue_arguments=common_arguments,
        ),
        Queue(
            ANALYTICS_QUEUE,
            Exchange(ANALYTICS_QUEUE, type=exchange_type, durable=True),
            routing_key=ANALYTICS_QUEUE,
            queue_arguments=common_arguments,
        ),
    )


@app.on_after_configure.connect
def queues_configure(sender: Celery, source, **kwargs) -> None:
    """Declare the queues as CELERY_QUEUE_TYPE says, when Celery first reads its configuration."""
    from django.conf import settings

    source.task_queues = task_queues(queue_type=settings.CELERY_QUEUE_TYPE, max_retries=settings.CREDITS_MAX_RETRIES)


app.autodiscover_tasks()

# Time limits are the running worker's settings, never the publisher's (core/celery_publish.py).
signals.before_task_publish.connect(time_limits_left_to_workers, weak=False)

# The worker's machinery. Its signal handlers connect on import, here after the app was created: Celery's Django fixup
# connects its worker_init receiver then, and django_fixup_per_task_skip must run after it.
from core import worker  # noqa: E402

# credits.dlx is declared on every broker connection.
app.steps["consumer"].add(worker.DeclareCreditsDeadLetterQueue)

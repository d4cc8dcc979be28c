"""The Celery app: RabbitMQ broker, the outbox, credits and analytics queues, and delivery guarantees.

Every Celery setting lives here, each with the reason for it, so the delivery semantics can be read in one place.
"""

import contextlib
import math
import os
import signal
import threading
import time

from celery import Celery, bootsteps, signals, states
from celery.fixups.django import DjangoFixup
from celery.worker.consumer import Consumer
from celery.worker.consumer.delayed_delivery import DelayedDelivery
from django.db import close_old_connections, connections
from kombu import Exchange, Queue
from kombu.transport.native_delayed_delivery import (
    bind_queue_to_native_delayed_delivery_exchange,
    declare_native_delayed_delivery_exchanges_and_queues,
)

from core.contract import (
    ANALYTICS_QUEUE,
    CREDITS_DEAD_EXCHANGE,
    CREDITS_DEAD_QUEUE,
    CREDITS_QUEUE,
    OUTBOX_QUEUE,
    QUEUE_TYPE_QUORUM,
)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("creditshop")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.update(
    # JSON only: messages are read by other services and by people in the dead-letter queue.
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    # No result backend: the database rows are the results.
    task_ignore_result=True,
    # The broker confirms every publish, so a publish that returned reached the broker.
    broker_transport_options={"confirm_publish": True},
    broker_connection_retry_on_startup=True,
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
    # handlers below keep reuse safe, and django_fixup_per_task_skip takes the fixup's own per-task handlers out
    # altogether; this stays for a Celery whose fixup they fail to find. (Read by celery.fixups.django under this
    # old-style name.)
    CELERY_DB_REUSE_MAX=10_000,
    # Celery's consumer, but setting up native delayed delivery (quorum queues) once per cluster: see below.
    worker_consumer="config.celery:ClusterConsumer",
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
    """Return the outbox, credits, credits.dead and analytics queues, declared as `queue_type` (CELERY_QUEUE_TYPE).

    classic: one node, direct exchanges, and a retry's delay held by the worker (an ETA task in memory).
    quorum: replicated on a majority of a cluster's nodes (Raft), so a publisher confirm means a majority has the
    message. Their exchanges are topic exchanges because Celery's native delayed delivery, which holds a retry's
    delay in the broker (celery_delayed_* queues, bound by the worker at start), skips direct exchanges.
    Dead-lettering is at-least-once (the dead letter is confirmed by credits.dead before the original is dropped;
    RabbitMQ requires overflow reject-publish for it), and the delivery limit agrees with CREDITS_MAX_RETRIES:
    a message redelivered more than max_retries times (its workers died holding it) is dead-lettered by the consumer
    with its DeadLetter row (credits/tasks.py), and by the broker itself, still never dropped, if even that delivery
    kills its worker.
    """
    quorum = queue_type == QUEUE_TYPE_QUORUM
    exchange_type = "topic" if quorum else "direct"
    credits_arguments = {
        "x-dead-letter-exchange": CREDITS_DEAD_EXCHANGE,
        "x-dead-letter-routing-key": CREDITS_DEAD_QUEUE,
    }
    common_arguments = {}
    if quorum:
        common_arguments = {"x-queue-type": QUEUE_TYPE_QUORUM}
        credits_arguments |= {
            "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish",
            "x-delivery-limit": max_retries + 1,
        }
    return (
        Queue(
            OUTBOX_QUEUE,
            Exchange(OUTBOX_QUEUE, type=exchange_type, durable=True),
            routing_key=OUTBOX_QUEUE,
            queue_arguments=common_arguments or None,
        ),
        # A rejected (not requeued) credits message is routed by the broker itself to credits.dead.
        Queue(
            CREDITS_QUEUE,
            Exchange(CREDITS_QUEUE, type=exchange_type, durable=True),
            routing_key=CREDITS_QUEUE,
            queue_arguments=common_arguments | credits_arguments,
        ),
        Queue(
            CREDITS_DEAD_QUEUE,
            Exchange(CREDITS_DEAD_EXCHANGE, type="direct", durable=True),
            routing_key=CREDITS_DEAD_QUEUE,
            queue_arguments=common_arguments or None,
        ),
        Queue(
            ANALYTICS_QUEUE,
            Exchange(ANALYTICS_QUEUE, type=exchange_type, durable=True),
            routing_key=ANALYTICS_QUEUE,
            queue_arguments=common_arguments or None,
        ),
    )


@app.on_after_configure.connect
def queues_configure(sender: Celery, source, **kwargs) -> None:
    """Declare the queues as CELERY_QUEUE_TYPE says, when Celery first reads its configuration."""
    from django.conf import settings

    source.task_queues = task_queues(queue_type=settings.CELERY_QUEUE_TYPE, max_retries=settings.CREDITS_MAX_RETRIES)


app.autodiscover_tasks()


class DeclareCreditsDeadLetterQueue(bootsteps.StartStopStep):
    """Declare credits.dlx and credits.dead on each broker connection of a worker, before it runs any task.

    A worker consuming only `credits` declares only that queue, and RabbitMQ silently drops a message dead-lettered
    to an exchange that does not exist.
    """

    requires = {"celery.worker.consumer.connection:Connection"}

    def start(self, c):
        c.app.amqp.queues[CREDITS_DEAD_QUEUE].bind(c.connection.default_channel).declare()


app.steps["consumer"].add(DeclareCreditsDeadLetterQueue)


class ClusterDelayedDelivery(DelayedDelivery):
    """Celery's native delayed delivery set-up, done once through the node the consumer is connected to.

    Celery's own step sets it up through every URL of CELERY_BROKER_URL in turn, retrying a node that is down for
    about 20 s, and the worker consumes nothing meanwhile: after losing a cluster node, each reconnection stalled
    there (tests/reliability/test_node_loss.py). A cluster shares its exchanges, queues and bindings, so one node
    is enough, and it is the one the consumer just connected to.

    It binds the queues this worker consumes (declared by then), not every queue the app knows: on a new vhost a
    `-Q credits` worker would otherwise fail to start, binding `analytics`, whose exchange nobody had declared yet.
    Each queue's own workers bind it.
    """

    def start(self, c: Consumer) -> None:
        with c.app.connection_for_write(url=c.connection.as_uri(include_password=True)) as connection:
            declare_native_delayed_delivery_exchanges_and_queues(
                connection, c.app.conf.broker_native_delayed_delivery_queue_type
            )
            for queue in c.task_consumer.queues:
                # Nothing is ever delayed to credits.dead, whose direct exchange Celery would only warn about.
                if queue.name != CREDITS_DEAD_QUEUE:
                    bind_queue_to_native_delayed_delivery_exchange(connection, queue)


class ClusterConsumer(Consumer):
    """Celery's consumer with ClusterDelayedDelivery in place of its own delayed delivery step."""

    class Blueprint(Consumer.Blueprint):
        default_steps = [
            "config.celery:ClusterDelayedDelivery" if step.endswith(":DelayedDelivery") else step
            for step in Consumer.Blueprint.default_steps
        ]


# How often a worker thread checks its database connections before a task. Checking before every task, as Django
# does per request, put a ping round trip in front of each credit award: a quarter of its time (py-spy). A connection
# that dies between checks fails one task with a transient error; the task is retried, and task_postrun below has
# replaced the connection by then.
DB_CHECK_INTERVAL_SECONDS = 1.0
_db_checked = threading.local()


@signals.task_prerun.connect
def database_connections_refresh(task=None, **kwargs) -> None:
    """Like Django per request, but at most once a second: close connections past CONN_MAX_AGE, health-check on use."""
    if getattr(task.request, "is_eager", False):
        return
    now = time.monotonic()
    if now - getattr(_db_checked, "at", -math.inf) >= DB_CHECK_INTERVAL_SECONDS:
        close_old_connections()
        _db_checked.at = now


@signals.worker_init.connect
def django_fixup_per_task_skip(**kwargs) -> None:
    """Take Celery's Django fixup out of every task run, its work being done here or needing none.

    Before and after each task it counts toward CELERY_DB_REUSE_MAX (the handlers above and below manage the
    connections instead: CONN_MAX_AGE, health checks, close after a failure) and closes Django's caches (the Redis
    cache's close does nothing); two of six receivers per task, about 3% of a credit award's CPU (cProfile). The
    fixup connects them from its own worker_init receiver, connected when the app was created, so before this one.
    Its other work (closing connections a prefork child inherited, django.setup) stays.
    """
    for fixup in app._fixups:
        if isinstance(fixup, DjangoFixup) and fixup._worker_fixup is not None:
            signals.task_prerun.disconnect(fixup.worker_fixup.on_task_prerun)
            signals.task_postrun.disconnect(fixup.worker_fixup.on_task_postrun)


@signals.task_postrun.connect
def database_connections_close_after_failure(task=None, state=None, **kwargs) -> None:
    """Close the connections after a task that did not succeed: a failed query can leave one unusable unnoticed."""
    if state != states.SUCCESS and not getattr(task.request, "is_eager", False):
        connections.close_all()


@signals.worker_shutting_down.connect
def long_tasks_interrupt(**kwargs) -> None:
    """On a worker's shutdown, SIGTERM the pool processes running a task marked `interrupt_on_worker_shutdown`.

    A warm shutdown waits for the tasks in hand, which suits tasks of milliseconds (they finish; what was prefetched
    goes back to the queue with the connection) but not the nightly run, which takes hours: that task passes the
    signal to its command, which records the run as interrupted and exits, and the task requeues its message
    (analytics/tasks.py). Runs in the main process, from Celery's signal handler.
    """
    from celery.worker import state

    for request in list(state.active_requests):
        pid = request.worker_pid
        if getattr(request.task, "interrupt_on_worker_shutdown", False) and pid and pid != os.getpid():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)


# --- tracing and log context (core/tracing.py, core/logs.py) -------------------------------------------------


@signals.worker_process_init.connect
def tracing_start_in_pool_process(**kwargs) -> None:
    """Set up tracing where tasks run: each prefork pool process, or a solo worker's only process."""
    from core.tracing import tracing_setup

    tracing_setup(service_name="creditshop-worker", celery=True, sql=_sql_spans())


@signals.worker_init.connect
def tracing_start_in_threads_worker(sender=None, **kwargs) -> None:
    """Set up tracing in a threads-pool worker, which runs tasks in its main process and sends no process init."""
    from core.tracing import tracing_setup

    if getattr(getattr(sender, "pool_cls", None), "__module__", "") == "celery.concurrency.thread":
        tracing_setup(service_name="creditshop-worker", celery=True, sql=_sql_spans())


def _sql_spans() -> bool:
    # A span per statement triples the spans of an award; TRACING_SQL_SPANS=false trades them for CPU
    # (docs/PERFORMANCE.md, "Tracing overhead").
    from django.conf import settings

    return settings.TRACING_SQL_SPANS


@signals.after_setup_logger.connect
@signals.after_setup_task_logger.connect
def log_context_install(logger=None, **kwargs) -> None:
    """Give the handlers Celery installs the trace and transaction fields, and the JSON format if LOG_FORMAT=json."""
    from django.conf import settings

    from core.logs import celery_logging_install

    celery_logging_install(logger, json_format=settings.LOG_FORMAT == "json")

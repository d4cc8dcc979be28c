"""What runs inside a Celery worker around every task, in one place (zulip's QueueProcessingWorker, as hooks).

config/celery.py holds the settings and the queues; this module is the worker's machinery, connected when that
module imports it: the queues a credits consumer takes (those of the versions it accepts), the consumer's boot steps
(credits.dlx declared on every connection, native delayed delivery set up once per cluster, no worker-heartbeat
events), the task class every task derives from (WorkerTask: the database
checks before and after each task, as a call around its run; Celery's Django fixup kept out of them), the
interruption of long tasks on shutdown, tracing started where tasks run, and the log context on Celery's handlers.
Time limits are settings (CELERY_TASK_SOFT_TIME_LIMIT, CELERY_TASK_TIME_LIMIT, the nightly run's in
CELERY_TASK_ANNOTATIONS).
"""

import contextlib
import functools
import math
import os
import signal
import threading
import time

from celery import bootsteps, signals
from celery.contrib.django.task import DjangoTask
from celery.fixups.django import DjangoFixup
from celery.worker.consumer import Consumer
from celery.worker.consumer.delayed_delivery import DelayedDelivery
from django.db import close_old_connections, connections
from kombu.transport.native_delayed_delivery import (
    bind_queue_to_native_delayed_delivery_exchange,
    declare_native_delayed_delivery_exchanges_and_queues,
)

from core.contract import CREDITS_DEAD_QUEUE, CREDITS_QUEUE
from core.credits_queues import VERSION_QUEUE_PREFIX, consumed_queue_names


class DeclareCreditsDeadLetterQueue(bootsteps.StartStopStep):
    """Declare credits.dlx and credits.dead on each broker connection of a worker, before it runs any task.

    A worker consuming only `credits` declares only that queue, and RabbitMQ silently drops a message dead-lettered
    to an exchange that does not exist.
    """

    requires = {"celery.worker.consumer.connection:Connection"}

    def start(self, c):
        c.app.amqp.queues[CREDITS_DEAD_QUEUE].bind(c.connection.default_channel).declare()


@signals.celeryd_after_setup.connect
def credits_version_queues_select(sender=None, instance=None, **kwargs) -> None:
    """Make a worker that consumes `credits` (`-Q credits`) take the queues of the versions it accepts too.

    `credits` stays the name operators and unit files give; the versions come from CREDITS_ACCEPTED_MESSAGE_VERSIONS,
    so a consumer never receives a message of a version it does not accept (core/credits_queues.py).
    """
    from django.conf import settings

    queues = instance.app.amqp.queues
    if CREDITS_QUEUE not in queues.consume_from:
        return
    wanted = consumed_queue_names(settings.CREDITS_ACCEPTED_MESSAGE_VERSIONS)
    for name in wanted:
        queues.select_add(queues[name])
    # A worker started without -Q consumes every queue the app declares: not the versions it does not accept.
    queues.deselect([name for name in queues if name.startswith(VERSION_QUEUE_PREFIX) and name not in wanted])


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


# The longest a worker waits between two attempts to reach the broker again. kombu's own waits grow by 2 s up to 30 s:
# after a long outage or silence a worker found the broker back up to 30 s (and a connect timeout) late.
RECONNECT_INTERVAL_MAX_SECONDS = 5.0


class ClusterConsumer(Consumer):
    """Celery's consumer with ClusterDelayedDelivery in place of its own delayed delivery step, without Heart, and
    reconnecting at least every RECONNECT_INTERVAL_MAX_SECONDS.

    Heart publishes a worker-heartbeat event every 2 s from the worker's event loop, retrying a lost connection
    without limit: while the broker is unreachable the loop stood still in that retry, so the worker neither sent
    its AMQP heartbeats nor noticed its own connection was dead until the broker answered again (a Celery signal
    handler's stack dump, tests/reliability/test_silence_broker.py). Nothing here reads those events (monitors such as
    Flower do); `celery inspect ping` answers through the control queue instead. Like `--without-heartbeat`.
    """

    class Blueprint(Consumer.Blueprint):
        default_steps = [
            "core.worker:ClusterDelayedDelivery" if step.endswith(":DelayedDelivery") else step
            for step in Consumer.Blueprint.default_steps
            if not step.endswith(":Heart")
        ]

    def ensure_connected(self, conn):
        # Celery calls kombu's ensure_connection with kombu's default intervals; the connection is new on every
        # reconnection, so its own retry is bounded here.
        conn.ensure_connection = functools.partial(
            conn.ensure_connection, interval_start=1, interval_step=1, interval_max=RECONNECT_INTERVAL_MAX_SECONDS
        )
        return super().ensure_connected(conn)


# How often a worker thread checks its database connections before a task. Checking before every task, as Django
# does per request, puts a ping round trip in front of each credit award, a task of a few round trips. A connection
# that dies between checks fails one task with a transient error; the task is retried, and the failed run has closed
# the connection by then (WorkerTask below).
DB_CHECK_INTERVAL_SECONDS = 1.0
_db_checked = threading.local()


class WorkerTask(DjangoTask):
    """Every task's class (config/celery.py): each run in a worker checks the database connections first (at most
    once a second per thread) and closes them if it fails (a failed query can leave one unusable unnoticed).

    A call around the run, not task_prerun/task_postrun receivers: Celery's tracer sends those signals only when some
    receiver is connected, and sending them (the signal machinery, its keyword arguments, each receiver's call) is
    work on every award (docs/PERFORMANCE.md). Celery already calls the task object
    rather than its run in a worker (its stack protection counts as an override of __call__), so this costs no
    extra call. Direct calls and eager runs go through Celery's own __call__, and leave the caller's connections alone.
    """

    def __call__(self, *args, **kwargs):
        stack = self.request_stack
        request = stack.top
        if request is None or request.called_directly or request.is_eager or len(stack) != 1:
            return super().__call__(*args, **kwargs)
        _database_connections_refresh_if_due()
        try:
            return self.run(*args, **kwargs)
        except BaseException:  # Retry and Reject too: the database may be why
            connections.close_all()
            raise


def database_connections_refresh(task=None) -> None:
    """Like Django per request, but at most once a second: close connections past CONN_MAX_AGE, health-check on use."""
    if not getattr(task.request, "is_eager", False):
        _database_connections_refresh_if_due()


def _database_connections_refresh_if_due() -> None:
    now = time.monotonic()
    if now - getattr(_db_checked, "at", -math.inf) >= DB_CHECK_INTERVAL_SECONDS:
        close_old_connections()
        _db_checked.at = now


@signals.worker_init.connect
def django_fixup_per_task_skip(sender=None, **kwargs) -> None:
    """Take Celery's Django fixup out of every task run, its work being done here or needing none.

    Before and after each task it counts toward CELERY_DB_REUSE_MAX (WorkerTask manages the connections instead:
    CONN_MAX_AGE, health checks, close after a failure) and closes Django's caches (the Redis cache's close does
    nothing): two of six receivers per task, work on every award for nothing. The fixup connects them
    from its own worker_init receiver, connected when the app was created, so before this one. Its other work
    (closing connections a prefork child inherited, django.setup) stays.
    """
    for fixup in sender.app._fixups:
        if isinstance(fixup, DjangoFixup) and fixup._worker_fixup is not None:
            signals.task_prerun.disconnect(fixup.worker_fixup.on_task_prerun)
            signals.task_postrun.disconnect(fixup.worker_fixup.on_task_postrun)


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


# --- tracing and log context (core/tracing.py, core/logs.py) ----------------------------------------------------


@signals.worker_process_init.connect
def tracing_start_in_pool_process(**kwargs) -> None:
    """Set up tracing where tasks run: each prefork pool process, or a solo worker's only process."""
    from core.celery_spans import celery_spans_install
    from core.tracing import tracing_setup

    tracing_setup(service_name="creditshop-worker", instrument=[celery_spans_install], sql=_sql_spans())


@signals.worker_init.connect
def tracing_start_in_threads_worker(sender=None, **kwargs) -> None:
    """Set up tracing in a threads-pool worker, which runs tasks in its main process and sends no process init."""
    from core.celery_spans import celery_spans_install
    from core.tracing import tracing_setup

    if getattr(getattr(sender, "pool_cls", None), "__module__", "") == "celery.concurrency.thread":
        tracing_setup(service_name="creditshop-worker", instrument=[celery_spans_install], sql=_sql_spans())


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

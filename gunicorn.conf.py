"""gunicorn's settings, read from the working directory by `gunicorn config.wsgi`: workers that boot fast.

On HUP (graceful reload) gunicorn forks the new workers and at once sends the old ones SIGTERM (Arbiter.reload):
the old ones finish the requests they hold and take no new ones, so new connections wait in the listen backlog
until a new worker has booted. A worker's boot is that wait, and a full restart's too; this file shortens it.
Command-line options override what is set here; docs/OPERATIONS.md, "Stopping and restarting", has the figures.
"""

import importlib

from gunicorn.workers.gthread import ThreadWorker

# On SIGTERM (or a HUP, TTOU) a worker takes no new request and has this long to finish the ones it holds. Orders and
# every other request take milliseconds; ten seconds is room for a slow admin page. systemd's TimeoutStopSec for
# the web must exceed it (docs/OPERATIONS.md, "Stopping and restarting").
graceful_timeout = 10

# An idle keep-alive connection stays open this long. It must outlast the idle timeout of whatever holds connections
# to gunicorn (a load balancer: 60 s on AWS's ALB and nginx's upstream default), so that the client side always closes
# first: when gunicorn closes a connection just as a request is sent on it, that request fails (a reset, or "remote
# end closed connection"); gunicorn's default of 2 s meets that with clients pausing about 2 s between bursts
# (docs/PERFORMANCE.md). An idle connection costs
# a gthread worker a socket in its poller, no thread.
keepalive = 75

# Third-party modules the application imports that need no Django settings, imported once in the master so every
# worker forked on start or on HUP inherits them: a worker's boot (import config.wsgi and the URLconf) then imports
# only the application's own modules (config and the apps), which each worker still imports, so HUP picks up a new
# release of them; a new release of one of these
# packages needs a full stop and start (tests/test_gunicorn_conf.py checks the master imports none of ours).
PRELOADED_MODULES = (
    "MySQLdb",
    "amqp",
    "celery.app.base",
    "django.contrib.admin",
    "django.core.handlers.wsgi",
    "django.db.backends.mysql.base",
    "django.db.models",
    "django.forms",
    "django.template.defaulttags",
    "hiredis",
    "kombu",
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.instrumentation.django",
    "opentelemetry.sdk.trace",
    "prometheus_client",
    "pythonjsonlogger.json",
    "redis",
    "requests",
    "rest_framework.serializers",
    "sqlparse",
    "whitenoise.middleware",
    "yaml",
)
for _module in PRELOADED_MODULES:
    importlib.import_module(_module)


def post_worker_init(worker) -> None:
    """Give the worker the web's database deadlines and load the URLconf before taking requests, so no order pays for
    it, then log that the worker is ready."""
    from django.urls import get_resolver

    from core.deadlines import WEB, deadlines_apply

    # Short deadlines, failing fast once a database is found silent: every request is answered within 5 s.
    deadlines_apply(WEB)

    get_resolver().url_patterns  # noqa: B018 (the property imports every URL module)
    worker.log.info("Worker ready (pid: %s)", worker.pid)


class BalancedThreadWorker(ThreadWorker):
    """gunicorn's gthread worker, taking a new connection only while one of its threads is free.

    A gthread worker keeps every keep-alive connection it accepted, and all workers wait on one listening socket: when
    a client opens several connections at once, whichever worker runs first accepts them all, and then serves them
    with its threads on one GIL while the other workers idle. Counted with `ss` under `wrk -c8` against 4 workers x 2
    threads, plain gthread puts all 8 connections on one worker in most runs, and throughput moves with how they
    land. This worker stops accepting while as many requests as it has threads are in hand (from the accept to the
    answer), so the next connection goes to a worker with a free thread: 2, 2, 2, 2.

    Nothing is refused or capped: a worker still serves every connection it keeps, parks idle keep-alive connections
    in its poller as gthread does (they hold no thread), and accepts again the moment a request is answered. When
    every thread of every worker is busy, a new connection waits in the listen backlog instead of in one busy worker's
    queue, and the first thread to come free anywhere takes it. tests/test_gunicorn_conf.py checks the spread.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Requests handed to the thread pool and not yet finished. Only the worker's main thread changes it: every
        # enqueue_req and finish_request call runs there (the pool's completions come back through its method queue).
        self.requests_in_hand = 0

    def has_free_thread(self) -> bool:
        return self.requests_in_hand < self.cfg.threads

    def enqueue_req(self, conn):
        super().enqueue_req(conn)
        self.requests_in_hand += 1

    def finish_request(self, conn, fs):
        self.requests_in_hand -= 1
        super().finish_request(conn, fs)

    def set_accept_enabled(self, enabled):
        # The run loop asks for accepting whenever the worker is under worker_connections; a thread must be free too.
        super().set_accept_enabled(enabled and self.has_free_thread())

    def accept(self, listener):
        super().accept(listener)
        if not self.has_free_thread():
            # At once, so the other workers (woken by the same readiness) take the connections still waiting.
            super().set_accept_enabled(False)


# The class itself, not a dotted path: the master imports nothing of the application (tests/test_gunicorn_conf.py).
# A `--worker-class` on the command line replaces it.
worker_class = BalancedThreadWorker

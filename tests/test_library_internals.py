"""Every library internal the code relies on, checked in the shape it is relied on: one test per row of
docs/LIBRARY_INTERNALS.md, so an upgrade that changes one fails here first, naming its row, rather than somewhere in
the code's behaviour (tests/test_library_pins.py ties the rows to this file and to the pins). Each test is fast; only
those whose internal belongs to a live connection open one, to the local RabbitMQ, Redis or MariaDB.
"""

import ast
import functools
import inspect
import json
from datetime import UTC, datetime

import amqp
import MySQLdb.cursors
import pytest
from celery.app.task import Context
from celery.app.trace import task_has_custom
from celery.beat import PersistentScheduler, Scheduler
from celery.fixups.django import DjangoFixup, DjangoWorkerFixup
from celery.worker import state as worker_state
from celery.worker.consumer import Consumer
from celery.worker.consumer.delayed_delivery import DelayedDelivery
from celery.worker.request import Request
from django.conf import settings
from django.core.cache import caches
from django.db import connection
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.mysql import base as mysql_base
from django.db.utils import DatabaseErrorWrapper
from django.utils.functional import cached_property
from kombu import Message
from redis.commands.core import Script
from redis.connection import Connection as RedisConnection
from redis.connection import ConnectionPool
from rest_framework import parsers
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.test import APIRequestFactory
from rest_framework.throttling import SimpleRateThrottle
from rest_framework.views import APIView

import credits.tasks  # noqa: F401  (the requests below look the tasks up in this process's registry)
import outbox.tasks  # noqa: F401
from config.celery import app
from core.cache import shared_client
from core.celery_request import CELERY_REQUEST_KEYS, DecodedOnceRequest
from core.contract import AWARD_CREDITS_TASK, CREATED_AT_HEADER, RELAY_TASK
from core.sql_batches import _GALERA_NODE, galera_node
from core.worker import WorkerTask
from outbox.claims import ClaimedMessage
from outbox.messages import DEFAULT_VALUED_HEADERS, build_task_message
from outbox.wakeup import _wake_message


def row(name: str) -> str:
    """The failure message of a check: which row of the reference changed, and where to read what relies on it."""
    return f"an upgrade changed the internal of docs/LIBRARY_INTERNALS.md row `{name}`: read that row before pinning"


def parameters(function) -> list[str]:
    return list(inspect.signature(function).parameters)


def calls(function) -> set[str]:
    """Return the names of the attributes and functions a function's source calls."""
    tree = ast.parse(inspect.cleandoc("\n" + inspect.getsource(function)))
    return {
        node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
    }


# --- py-amqp (a live connection: these internals exist once connected) ------------------------------------------


@pytest.fixture(scope="module")
def broker():
    with app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=3)
        yield conn


def test_amqp_transport_write(broker):
    why = row("amqp-transport-write")
    transport = broker.connection.transport
    assert transport._write == transport.sock.sendall, why
    frames = []
    transport._write, write = frames.append, transport._write
    try:
        transport.write(b"probe")  # collected, never sent
    finally:
        transport._write = write
    assert frames == [b"probe"], why


def test_amqp_connection_blocked_capability(broker):
    why = row("amqp-connection-blocked")
    capabilities = broker.connection.client_properties["capabilities"]
    assert capabilities["connection.blocked"] is True, why
    publish = inspect.getsource(amqp.Channel._basic_publish)
    assert "client_properties.get('capabilities', {})" in publish, why
    assert "capabilities.get('connection.blocked', False)" in publish, why


def test_amqp_transport_sock(broker):
    why = row("amqp-transport-sock")
    assert broker.connection.transport.sock is broker.connection.sock, why
    assert broker.connection.sock.gettimeout() is None, why  # blocking once connected


# --- Django's Redis cache (core/cache.py, core/throttling.py, outbox/bell.py) -----------------------------------


def test_django_redis_cache_client():
    why = row("django-redis-cache-client")
    cache = caches["default"]
    backend = cache._cache
    assert parameters(backend.get_client) == ["key", "write"], why
    assert hasattr(backend, "__dict__"), why  # the shared clients are kept there
    client = shared_client(cache, write=True)
    assert client.connection_pool is backend.get_client(write=True).connection_pool, why
    assert client.ping(), why


def test_django_redis_cache_serializer():
    why = row("django-redis-cache-serializer")
    cache = caches["default"]
    cache.set("internals:probe", {"user": 7}, 5)
    stored = shared_client(cache).get(cache.make_and_validate_key("internals:probe"))
    assert cache._cache._serializer.loads(stored) == {"user": 7}, why
    cache.delete("internals:probe")


def test_django_redis_cache_servers():
    why = row("django-redis-cache-servers")
    servers = caches["default"]._cache._servers
    assert servers == [settings.CACHES["default"]["LOCATION"]], why


# --- Django's database backend (core/sql_batches.py, core/mysql/base.py) ----------------------------------------


@pytest.mark.django_db
def test_django_cursor_wrappers():
    why = row("django-cursor-wrappers")
    with connection.cursor() as cursor:
        assert isinstance(cursor.cursor, mysql_base.CursorWrapper), why
        assert isinstance(cursor.cursor.cursor, MySQLdb.cursors.Cursor), why


def test_django_cursor_steps():
    why = row("django-cursor-steps")
    # core/sql_batches._unread_batch opens a cursor with the steps connection.cursor() takes, less the wrapper.
    steps = calls(BaseDatabaseWrapper._cursor) | calls(BaseDatabaseWrapper._prepare_cursor)
    assert steps == {
        "close_if_health_check_failed",
        "ensure_connection",
        "_prepare_cursor",
        "create_cursor",
        "validate_thread_sharing",
        "make_debug_cursor",
        "make_cursor",
    }, why
    assert "self.queries_logged" in inspect.getsource(BaseDatabaseWrapper._prepare_cursor), why
    assert parameters(mysql_base.DatabaseWrapper.create_cursor) == ["self", "name"], why
    assert isinstance(BaseDatabaseWrapper.queries_logged, property), why


@pytest.mark.django_db
def test_django_execute_wrappers():
    why = row("django-execute-wrappers")
    before = list(connection.execute_wrappers)
    with connection.execute_wrapper(wrapper := lambda execute, *args: execute(*args)):
        assert connection.execute_wrappers == [*before, wrapper], why
    assert connection.execute_wrappers == before, why
    assert isinstance(connection.in_atomic_block, bool), why


def test_django_mysql_backend_hooks():
    why = row("django-mysql-backend-hooks")
    base = mysql_base.DatabaseWrapper
    assert parameters(base.get_new_connection) == ["self", "conn_params"], why
    assert parameters(base.is_usable) == ["self"], why
    assert isinstance(vars(BaseDatabaseWrapper)["wrap_database_errors"], cached_property), why
    assert parameters(DatabaseErrorWrapper.__init__) == ["self", "wrapper"], why
    assert "self.wrapper" in inspect.getsource(DatabaseErrorWrapper.__exit__), why


@pytest.mark.django_db
def test_mysqlclient_driver_connection():
    why = row("mysqlclient-driver-connection")
    galera_node(connection)  # keeps its answer in an attribute of ours on the driver connection
    driver = connection.connection
    assert isinstance(getattr(driver, _GALERA_NODE), bool), why
    for name in ("query", "store_result", "next_result", "affected_rows", "insert_id", "fileno"):
        assert callable(getattr(driver, name, None)), why
    driver.query("SELECT 1; SELECT 2")
    assert driver.store_result().fetch_row() == ((1,),), why
    assert driver.next_result() == 0 and driver.store_result().fetch_row() == ((2,),), why
    assert driver.next_result() == -1, why


# --- Celery: the worker's request and the messages built by hand ------------------------------------------------


def kombu_message(body, headers: dict, properties: dict) -> Message:
    """A message as the worker's consumer receives it from the broker."""
    return Message(
        body=body.encode() if isinstance(body, str) else body,
        content_type="application/json",
        content_encoding="utf-8",
        headers=headers,
        properties=properties,
        delivery_info={"exchange": "credits", "routing_key": "credits", "redelivered": False},
        channel=None,
    )


def test_celery_request_internals():
    why = row("celery-request")
    body = [[], {"message": {"order_id": 7}}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}]
    message = kombu_message(json.dumps(body), {"id": "t-1", "task": AWARD_CREDITS_TASK, "x-mine": 1}, {})
    plain = Request(message, app=app, task=app.tasks[AWARD_CREDITS_TASK])
    assert plain._decoded is False and plain._body == message.body, why
    assert list(plain._payload) == body and plain._request_dict["x-mine"] == 1, why
    assert (plain.body, plain.content_type) == (plain._body, plain._content_type), why
    request = DecodedOnceRequest(message, app=app, task=app.tasks[AWARD_CREDITS_TASK])
    assert request.body == body and request.content_encoding is None, why
    assert set(vars(Context)) <= CELERY_REQUEST_KEYS and "headers" in vars(Context), why


def test_celery_message_protocol_2_award():
    why = row("celery-message-protocol-2")
    headers, properties, body, _ = app.amqp.as_task_v2("t", AWARD_CREDITS_TASK, args=(), kwargs={}, kwargsrepr="")
    assert set(DEFAULT_VALUED_HEADERS) <= set(headers), why
    assert properties == {"correlation_id": "t", "reply_to": ""}, why
    assert body[:2] == ((), {}) and set(body[2]) == {"callbacks", "errbacks", "chain", "chord"}, why
    claimed = ClaimedMessage(
        id="01JINTERNALS00000000000000",
        payload={"order_id": 7},
        attempts=0,
        created_at=datetime(2026, 12, 1, tzinfo=UTC),
    )
    built = build_task_message(claimed)
    props = {"correlation_id": built.properties["correlation_id"], "reply_to": built.properties["reply_to"]}
    message = kombu_message(built.body, built.properties["application_headers"], props)
    # How a worker tells protocol 2 (a task header, a body not a dict of "args"), then reads it.
    assert "args" not in message.decode() and message.headers["task"] == AWARD_CREDITS_TASK, why
    request = Request(message, app=app, task=app.tasks[AWARD_CREDITS_TASK])
    assert (request.task_name, request.id) == (AWARD_CREDITS_TASK, claimed.id), why
    assert (request.args, request.kwargs) == ([], {"message": {"order_id": 7}}), why
    assert request.request_dict[CREATED_AT_HEADER] == claimed.created_at.timestamp(), why
    assert request.eta is None and request.expires is None, why


def test_celery_message_protocol_2_wakeup():
    why = row("celery-message-wakeup")
    headers, body = _wake_message()
    expires = datetime(2026, 12, 1, 12, tzinfo=UTC)
    headers = {**headers, "id": "w-1", "root_id": "w-1", "expires": expires.isoformat()}
    message = kombu_message(body, headers, {"correlation_id": "w-1", "reply_to": ""})
    request = Request(message, app=app, task=app.tasks[RELAY_TASK])
    assert (request.task_name, request.id) == (RELAY_TASK, "w-1"), why
    assert (request.args, request.kwargs) == ([], {}), why
    assert request.expires == expires, why


# --- Celery: the worker's machinery (core/worker.py, core/beat.py) ----------------------------------------------


def test_celery_django_fixup():
    why = row("celery-django-fixup")
    fixups = [fixup for fixup in app._fixups if isinstance(fixup, DjangoFixup)]
    assert len(fixups) == 1 and hasattr(fixups[0], "_worker_fixup"), why
    fresh = DjangoFixup(app)
    assert fresh._worker_fixup is None and fresh.worker_fixup is fresh._worker_fixup, why
    connects = inspect.getsource(DjangoWorkerFixup.install)
    assert "signals.task_prerun.connect(self.on_task_prerun)" in connects, why
    assert "signals.task_postrun.connect(self.on_task_postrun)" in connects, why


def test_celery_consumer_blueprint():
    why = row("celery-consumer-blueprint")
    steps = Consumer.Blueprint.default_steps
    assert "celery.worker.consumer.heart:Heart" in steps, why
    assert "celery.worker.consumer.delayed_delivery:DelayedDelivery" in steps, why
    assert parameters(Consumer.ensure_connected) == ["self", "conn"], why
    assert "ensure_connection" in calls(Consumer.ensure_connected), why
    assert parameters(DelayedDelivery.start) == ["self", "c"], why


def test_celery_task_call():
    why = row("celery-task-call")
    assert task_has_custom(app.tasks[AWARD_CREDITS_TASK], "__call__"), why
    assert isinstance(app.tasks[AWARD_CREDITS_TASK], WorkerTask), why
    stack = app.tasks[AWARD_CREDITS_TASK].request_stack
    assert stack.top is None and len(stack) == 0, why
    assert Context().called_directly is True and Context().is_eager is False, why


def test_celery_active_requests():
    why = row("celery-active-requests")
    message = kombu_message("[[], {}, {}]", {"id": "a-1", "task": RELAY_TASK}, {})
    request = Request(message, app=app, task=app.tasks[RELAY_TASK])
    worker_state.task_accepted(request)  # what the worker does when a pool process takes the request
    try:
        assert request in worker_state.active_requests, why
    finally:
        worker_state.task_ready(request)
    assert request.worker_pid is None and request.task is app.tasks[RELAY_TASK], why


def test_celery_beat_connection():
    why = row("celery-beat-connection")
    connection = inspect.getattr_static(PersistentScheduler, "connection")
    # Kept in the instance's __dict__ once read (functools' cached_property, which kombu's extends).
    assert isinstance(connection, functools.cached_property), why
    assert "super().close()" in inspect.getsource(PersistentScheduler.close), why
    assert "self.__dict__.pop('connection', None)" in inspect.getsource(Scheduler.close), why


# --- redis-py, Django REST framework, gunicorn, PySpark --------------------------------------------------------


def test_redis_connection_hooks():
    why = row("redis-connection-hooks")
    assert parameters(RedisConnection.connect) == ["self"], why
    assert parameters(RedisConnection.send_packed_command) == ["self", "command", "check_health"], why
    assert parameters(RedisConnection.read_response)[:2] == ["self", "disable_decoding"], why
    assert "connection_class" in parameters(ConnectionPool.__init__), why
    script = Script(None, b"return 1")
    assert parameters(script.__call__) == ["keys", "args", "client"], why


def test_drf_throttle_state():
    why = row("drf-throttle-state")
    throttle = type("Probe", (SimpleRateThrottle,), {"rate": "5/min", "scope": "probe"})()
    assert (throttle.num_requests, throttle.duration) == (5, 60), why
    assert isinstance(throttle.timer(), float), why
    assert SimpleRateThrottle.cache_format == "throttle_%(scope)s_%(ident)s", why


def test_drf_parser_encoding():
    why = row("drf-parser-encoding")
    assert parameters(parsers.get_encoding) == ["parser_context"], why
    assert "get_encoding(parser_context)" in inspect.getsource(parsers.JSONParser.parse), why


def test_drf_response_finalize():
    why = row("drf-response-finalize")

    class Probe(APIView):
        def get(self, request):
            return Response({"x": 1})

    answered = Probe.as_view()(APIRequestFactory().get("/", HTTP_ACCEPT="application/json"))
    assert isinstance(answered.accepted_renderer, JSONRenderer), why
    assert answered.accepted_media_type == "application/json", why
    assert isinstance(answered.renderer_context, dict), why
    headers = Probe().default_response_headers
    assert set(headers) == {"Allow", "Vary"} and answered["Vary"] == headers["Vary"], why
    response = Response({"x": 1})  # finalized by hand, as the fast path does
    response.accepted_renderer, response.accepted_media_type, response.renderer_context = (
        JSONRenderer(),
        "application/json",
        {},
    )
    assert response.render().content == b'{"x":1}', why


def test_gunicorn_thread_worker():
    why = row("gunicorn-thread-worker")
    from gunicorn.workers.gthread import ThreadWorker

    expected = {"enqueue_req": ["conn"], "finish_request": ["conn", "fs"], "set_accept_enabled": ["enabled"]}
    for name, names in {**expected, "accept": ["listener"]}.items():
        assert parameters(getattr(ThreadWorker, name))[1:] == names, why
    # The run loop asks for accepting; an accepted connection is enqueued; its completion comes back to the main thread.
    assert "set_accept_enabled" in calls(ThreadWorker.run), why
    assert "enqueue_req" in calls(ThreadWorker.accept), why
    enqueue = inspect.getsource(ThreadWorker.enqueue_req)
    assert "self.method_queue.defer(self.finish_request, conn, fut)" in enqueue, why


def test_pyspark_jvm_gateway():
    why = row("pyspark-jvm-gateway")
    from pyspark import SparkContext

    assert "_jvm" in vars(SparkContext), why
    assert "self._jsc = " in inspect.getsource(SparkContext), why

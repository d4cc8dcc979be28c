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
from rest_framework.request import Request as DRFRequest
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


def internal(name: str):
    """Make a test of a row's internal fail naming its row, whatever the check that failed raised."""

    def decorate(test):
        @functools.wraps(test)
        def checked(*args, **kwargs):
            try:
                return test(*args, **kwargs)
            except Exception as exc:
                raise AssertionError(
                    f"an upgrade changed the internal of docs/LIBRARY_INTERNALS.md row `{name}`: read that row "
                    f"before pinning ({type(exc).__name__}: {exc})"
                ) from exc

        return checked

    return decorate


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


@pytest.fixture(scope="module")
def broker():
    with app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=3)
        yield conn


@internal("amqp-transport-write")
def test_amqp_transport_write(broker):
    transport = broker.connection.transport
    assert transport._write == transport.sock.sendall
    frames = []
    transport._write, write = frames.append, transport._write
    try:
        transport.write(b"probe")  # collected, never sent
    finally:
        transport._write = write
    assert frames == [b"probe"]


@internal("amqp-connection-blocked")
def test_amqp_connection_blocked_capability(broker):
    capabilities = broker.connection.client_properties["capabilities"]
    assert capabilities["connection.blocked"] is True
    publish = inspect.getsource(amqp.Channel._basic_publish)
    assert "client_properties.get('capabilities', {})" in publish
    assert "capabilities.get('connection.blocked', False)" in publish


@internal("amqp-transport-sock")
def test_amqp_transport_sock(broker):
    assert broker.connection.transport.sock is broker.connection.sock
    assert broker.connection.sock.gettimeout() is None  # blocking once connected


@internal("django-redis-cache-client")
def test_django_redis_cache_client():
    cache = caches["default"]
    backend = cache._cache
    assert parameters(backend.get_client) == ["key", "write"]
    assert hasattr(backend, "__dict__")  # the shared clients are kept there
    client = shared_client(cache, write=True)
    assert client.connection_pool is backend.get_client(write=True).connection_pool
    assert client.ping()


@internal("django-redis-cache-serializer")
def test_django_redis_cache_serializer():
    cache = caches["default"]
    cache.set("internals:probe", {"user": 7}, 5)
    stored = shared_client(cache).get(cache.make_and_validate_key("internals:probe"))
    assert cache._cache._serializer.loads(stored) == {"user": 7}
    cache.delete("internals:probe")


@internal("django-redis-cache-servers")
def test_django_redis_cache_servers():
    servers = caches["default"]._cache._servers
    assert servers == [settings.CACHES["default"]["LOCATION"]]


# Outside a test case's transaction, so the test leaves no connection open behind it (Django closes it afterwards).
database = pytest.mark.django_db(transaction=True, databases=["default"])


@database
@internal("django-cursor-wrappers")
def test_django_cursor_wrappers():
    with connection.cursor() as cursor:
        assert isinstance(cursor.cursor, mysql_base.CursorWrapper)
        assert isinstance(cursor.cursor.cursor, MySQLdb.cursors.Cursor)


@internal("django-cursor-steps")
def test_django_cursor_steps():
    # core/sql_batches._unread_batch opens a cursor with the steps connection.cursor() takes, less the wrapper.
    steps = calls(BaseDatabaseWrapper._cursor) | calls(BaseDatabaseWrapper._prepare_cursor)
    expected = "close_if_health_check_failed ensure_connection _prepare_cursor create_cursor validate_thread_sharing"
    assert steps == {*expected.split(), "make_debug_cursor", "make_cursor"}
    assert "self.queries_logged" in inspect.getsource(BaseDatabaseWrapper._prepare_cursor)
    assert parameters(mysql_base.DatabaseWrapper.create_cursor) == ["self", "name"]
    assert isinstance(BaseDatabaseWrapper.queries_logged, property)


@database
@internal("django-execute-wrappers")
def test_django_execute_wrappers():
    before = list(connection.execute_wrappers)
    with connection.execute_wrapper(wrapper := lambda execute, *args: execute(*args)):
        assert connection.execute_wrappers == [*before, wrapper]
    assert connection.execute_wrappers == before
    assert isinstance(connection.in_atomic_block, bool)


@internal("django-mysql-backend-hooks")
def test_django_mysql_backend_hooks():
    base = mysql_base.DatabaseWrapper
    assert parameters(base.get_new_connection) == ["self", "conn_params"]
    assert parameters(base.is_usable) == ["self"]
    assert isinstance(vars(BaseDatabaseWrapper)["wrap_database_errors"], cached_property)
    assert parameters(DatabaseErrorWrapper.__init__) == ["self", "wrapper"]
    assert "self.wrapper" in inspect.getsource(DatabaseErrorWrapper.__exit__)


@database
@internal("mysqlclient-driver-connection")
def test_mysqlclient_driver_connection():
    connection.ensure_connection()
    galera_node(connection)  # keeps its answer in an attribute of ours on the driver connection
    driver = connection.connection
    assert isinstance(getattr(driver, _GALERA_NODE), bool)
    for name in ("query", "store_result", "next_result", "affected_rows", "insert_id", "fileno"):
        assert callable(getattr(driver, name, None))
    driver.query("SELECT 1; SELECT 2")
    assert driver.store_result().fetch_row() == ((1,),)
    assert driver.next_result() == 0 and driver.store_result().fetch_row() == ((2,),)
    assert driver.next_result() == -1


def kombu_message(body, headers: dict, properties: dict) -> Message:
    """A message as the worker's consumer receives it from the broker."""
    delivery = {"exchange": "credits", "routing_key": "credits", "redelivered": False}
    json_content = {"content_type": "application/json", "content_encoding": "utf-8"}
    body = body.encode() if isinstance(body, str) else body
    return Message(body, headers=headers, properties=properties, delivery_info=delivery, channel=None, **json_content)


@internal("celery-request")
def test_celery_request_internals():
    body = [[], {"message": {"order_id": 7}}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}]
    message = kombu_message(json.dumps(body), {"id": "t-1", "task": AWARD_CREDITS_TASK, "x-mine": 1}, {})
    plain = Request(message, app=app, task=app.tasks[AWARD_CREDITS_TASK])
    assert plain._decoded is False and plain._body == message.body
    assert list(plain._payload) == body and plain._request_dict["x-mine"] == 1
    assert (plain.body, plain.content_type) == (plain._body, plain._content_type)
    request = DecodedOnceRequest(message, app=app, task=app.tasks[AWARD_CREDITS_TASK])
    assert request.body == body and request.content_encoding is None
    assert set(vars(Context)) <= CELERY_REQUEST_KEYS and "headers" in vars(Context)


@internal("celery-message-protocol-2")
def test_celery_message_protocol_2_award():
    headers, properties, body, _ = app.amqp.as_task_v2("t", AWARD_CREDITS_TASK, args=(), kwargs={}, kwargsrepr="")
    assert set(DEFAULT_VALUED_HEADERS) <= set(headers)
    assert properties == {"correlation_id": "t", "reply_to": ""}
    assert body[:2] == ((), {}) and set(body[2]) == {"callbacks", "errbacks", "chain", "chord"}
    created_at = datetime(2026, 12, 1, tzinfo=UTC)
    claimed = ClaimedMessage(
        id="01JINTERNALS00000000000000", payload={"order_id": 7}, attempts=0, created_at=created_at
    )
    built = build_task_message(claimed)
    props = {"correlation_id": built.properties["correlation_id"], "reply_to": built.properties["reply_to"]}
    message = kombu_message(built.body, built.properties["application_headers"], props)
    # How a worker tells protocol 2 (a task header, a body not a dict of "args"), then reads it.
    assert "args" not in message.decode() and message.headers["task"] == AWARD_CREDITS_TASK
    request = Request(message, app=app, task=app.tasks[AWARD_CREDITS_TASK])
    assert (request.task_name, request.id) == (AWARD_CREDITS_TASK, claimed.id)
    assert (request.args, request.kwargs) == ([], {"message": {"order_id": 7}})
    assert request.request_dict[CREATED_AT_HEADER] == claimed.created_at.timestamp()
    assert request.eta is None and request.expires is None


@internal("celery-message-wakeup")
def test_celery_message_protocol_2_wakeup():
    headers, body = _wake_message()
    expires = datetime(2026, 12, 1, 12, tzinfo=UTC)
    headers = {**headers, "id": "w-1", "root_id": "w-1", "expires": expires.isoformat()}
    message = kombu_message(body, headers, {"correlation_id": "w-1", "reply_to": ""})
    request = Request(message, app=app, task=app.tasks[RELAY_TASK])
    assert (request.task_name, request.id) == (RELAY_TASK, "w-1")
    assert (request.args, request.kwargs) == ([], {})
    assert request.expires == expires


@internal("celery-django-fixup")
def test_celery_django_fixup():
    fixups = [fixup for fixup in app._fixups if isinstance(fixup, DjangoFixup)]
    assert len(fixups) == 1 and hasattr(fixups[0], "_worker_fixup")
    fresh = DjangoFixup(app)
    assert fresh._worker_fixup is None and fresh.worker_fixup is fresh._worker_fixup
    connects = inspect.getsource(DjangoWorkerFixup.install)
    assert "signals.task_prerun.connect(self.on_task_prerun)" in connects
    assert "signals.task_postrun.connect(self.on_task_postrun)" in connects


@internal("celery-consumer-blueprint")
def test_celery_consumer_blueprint():
    steps = Consumer.Blueprint.default_steps
    assert "celery.worker.consumer.heart:Heart" in steps
    assert "celery.worker.consumer.delayed_delivery:DelayedDelivery" in steps
    assert parameters(Consumer.ensure_connected) == ["self", "conn"]
    assert "ensure_connection" in calls(Consumer.ensure_connected)
    assert parameters(DelayedDelivery.start) == ["self", "c"]


@internal("celery-task-call")
def test_celery_task_call():
    assert task_has_custom(app.tasks[AWARD_CREDITS_TASK], "__call__")
    assert isinstance(app.tasks[AWARD_CREDITS_TASK], WorkerTask)
    stack = app.tasks[AWARD_CREDITS_TASK].request_stack
    assert stack.top is None and len(stack) == 0
    assert Context().called_directly is True and Context().is_eager is False


@internal("celery-active-requests")
def test_celery_active_requests():
    message = kombu_message("[[], {}, {}]", {"id": "a-1", "task": RELAY_TASK}, {})
    request = Request(message, app=app, task=app.tasks[RELAY_TASK])
    worker_state.task_accepted(request)  # what the worker does when a pool process takes the request
    try:
        assert request in worker_state.active_requests
    finally:
        worker_state.task_ready(request)
    assert request.worker_pid is None and request.task is app.tasks[RELAY_TASK]


@internal("celery-beat-connection")
def test_celery_beat_connection():
    connection = inspect.getattr_static(PersistentScheduler, "connection")
    # Kept in the instance's __dict__ once read (functools' cached_property, which kombu's extends).
    assert isinstance(connection, functools.cached_property)
    assert "super().close()" in inspect.getsource(PersistentScheduler.close)
    assert "self.__dict__.pop('connection', None)" in inspect.getsource(Scheduler.close)


@internal("celery-beat-schedule-store")
def test_celery_beat_schedule_store():
    # core/beat.Scheduler overrides some steps of Celery's opening of the schedule file and calls the others.
    setup = PersistentScheduler.setup_schedule
    assert {"_open_schedule", "_destroy_open_corrupted_schedule", "_create_schedule"} <= calls(setup)
    assert "self._store = " in inspect.getsource(setup)
    assert parameters(PersistentScheduler._destroy_open_corrupted_schedule) == ["self", "exc"]
    assert parameters(PersistentScheduler._open_schedule) == parameters(PersistentScheduler._remove_db) == ["self"]
    assert "self.schedule_filename + suffix" in inspect.getsource(PersistentScheduler._remove_db)
    assert "" in PersistentScheduler.known_suffixes and "self._store['entries']" in inspect.getsource(
        PersistentScheduler._create_schedule
    )


@internal("redis-connection-hooks")
def test_redis_connection_hooks():
    assert parameters(RedisConnection.connect) == ["self"]
    assert parameters(RedisConnection.send_packed_command) == ["self", "command", "check_health"]
    assert parameters(RedisConnection.read_response)[:2] == ["self", "disable_decoding"]
    assert "connection_class" in parameters(ConnectionPool.__init__)
    script = Script(None, b"return 1")
    assert parameters(script.__call__) == ["keys", "args", "client"]


@internal("drf-throttle-state")
def test_drf_throttle_state():
    throttle = type("Probe", (SimpleRateThrottle,), {"rate": "5/min", "scope": "probe"})()
    assert (throttle.num_requests, throttle.duration) == (5, 60)
    assert isinstance(throttle.timer(), float)
    assert SimpleRateThrottle.cache_format == "throttle_%(scope)s_%(ident)s"


@internal("drf-parser-encoding")
def test_drf_parser_encoding():
    assert parameters(parsers.get_encoding) == ["parser_context"]
    assert "get_encoding(parser_context)" in inspect.getsource(parsers.JSONParser.parse)


@internal("drf-dispatch-steps")
def test_drf_dispatch_steps():
    # orders/fast_path.py takes APIView.dispatch's and initial's steps itself, with the view's own methods.
    assert {"initialize_request", "initial", "handle_exception", "finalize_response"} <= calls(APIView.dispatch)
    assert "self.headers = self.default_response_headers" in inspect.getsource(APIView.dispatch)
    initial = "get_format_suffix perform_content_negotiation determine_version perform_authentication"
    assert calls(APIView.initial) >= {*initial.split(), "check_permissions", "check_throttles"}
    assert isinstance(inspect.getattr_static(DRFRequest, "user"), property) and DRFRequest.user.fset is not None
    request = DRFRequest(APIRequestFactory().get("/"))
    request._authenticator, request.user = "token", "someone"  # as the fast path sets them
    assert request.successful_authenticator == "token" and request._request.user == "someone"
    assert {"negotiator", "parsers", "parser_context", "authenticators"} <= set(vars(request))
    response = Response({"x": 1})  # finalize_response sets these, rendered_content reads them
    response.accepted_renderer, response.accepted_media_type, response.renderer_context = JSONRenderer(), "a/b", {}
    assert response.render().content == b'{"x":1}'


@internal("gunicorn-thread-worker")
def test_gunicorn_thread_worker():
    from gunicorn.workers.gthread import ThreadWorker

    expected = {"enqueue_req": ["conn"], "finish_request": ["conn", "fs"], "set_accept_enabled": ["enabled"]}
    for name, names in {**expected, "accept": ["listener"]}.items():
        assert parameters(getattr(ThreadWorker, name))[1:] == names
    # The run loop asks for accepting; an accepted connection is enqueued; its completion comes back to the main thread.
    assert "set_accept_enabled" in calls(ThreadWorker.run)
    assert "enqueue_req" in calls(ThreadWorker.accept)
    enqueue = inspect.getsource(ThreadWorker.enqueue_req)
    assert "self.method_queue.defer(self.finish_request, conn, fut)" in enqueue


@internal("pyspark-jvm-gateway")
def test_pyspark_jvm_gateway():
    from pyspark import SparkContext

    assert "_jvm" in vars(SparkContext)
    assert "self._jsc = " in inspect.getsource(SparkContext)


@internal("django-testcase-teardown")
def test_django_testcase_teardown():
    from django.test import TransactionTestCase

    from testkit import committed

    # Every test case's teardown goes through the replaced method, the one its _post_teardown calls.
    assert TransactionTestCase._fixture_teardown is committed._fixture_teardown
    assert parameters(committed._flush) == ["self"] and "_fixture_teardown" in calls(TransactionTestCase._post_teardown)
    assert parameters(TransactionTestCase._databases_names) == ["include_mirrors"]

"""Every library internal the code relies on, checked in the shape it is relied on: one test per row of
docs/LIBRARY_INTERNALS.md, so an upgrade that changes one fails here first, naming its row, rather than somewhere in
the code's behaviour. Each test is fast; only those whose internal belongs to a live connection open one, to the local
RabbitMQ, Redis or MariaDB the suite runs against.
"""

import ast
import functools
import inspect
import json
import re
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path

import amqp
import pytest
from celery.app.task import Context
from celery.app.trace import task_has_custom
from celery.beat import PersistentScheduler, Scheduler
from celery.fixups.django import DjangoFixup, DjangoWorkerFixup
from celery.worker import state as worker_state
from celery.worker.consumer import Consumer
from celery.worker.consumer.delayed_delivery import DelayedDelivery
from celery.worker.request import Request
from django.core.cache import caches
from django.db import connection
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.mysql import base as mysql_base
from django.db.utils import DatabaseErrorWrapper
from django.utils.functional import cached_property
from kombu import Message
from packaging.requirements import Requirement
from redis.commands.core import Script
from redis.connection import Connection as RedisConnection
from redis.connection import ConnectionPool
from rest_framework import parsers
from rest_framework.response import Response
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

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "LIBRARY_INTERNALS.md"


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
    transport = broker.connection.transport
    assert transport._write == transport.sock.sendall, row("amqp-transport-write")
    frames = []
    transport._write, write = frames.append, transport._write
    try:
        transport.write(b"probe")  # collected, never sent
    finally:
        transport._write = write
    assert frames == [b"probe"], row("amqp-transport-write")


def test_amqp_connection_blocked_capability(broker):
    capabilities = broker.connection.client_properties["capabilities"]
    assert capabilities["connection.blocked"] is True, row("amqp-connection-blocked")
    publish = inspect.getsource(amqp.Channel._basic_publish)
    assert "client_properties.get('capabilities', {})" in publish, row("amqp-connection-blocked")
    assert "capabilities.get('connection.blocked', False)" in publish, row("amqp-connection-blocked")


def test_amqp_transport_sock(broker):
    assert broker.connection.transport.sock is broker.connection.sock, row("amqp-transport-sock")
    assert broker.connection.sock.gettimeout() is None, row("amqp-transport-sock")  # blocking once connected


# --- Django's Redis cache (core/cache.py, core/throttling.py, outbox/bell.py) -----------------------------------


def test_django_redis_cache_client():
    cache = caches["default"]
    backend = cache._cache
    assert parameters(backend.get_client) == ["key", "write"], row("django-redis-cache-client")
    assert hasattr(backend, "__dict__"), row("django-redis-cache-client")  # the shared clients are kept there
    client = shared_client(cache, write=True)
    assert client.connection_pool is backend.get_client(write=True).connection_pool, row("django-redis-cache-client")
    assert client.ping(), row("django-redis-cache-client")


def test_django_redis_cache_serializer():
    cache = caches["default"]
    cache.set("internals:probe", {"user": 7}, 5)
    stored = shared_client(cache).get(cache.make_and_validate_key("internals:probe"))
    assert cache._cache._serializer.loads(stored) == {"user": 7}, row("django-redis-cache-serializer")
    cache.delete("internals:probe")


def test_django_redis_cache_servers():
    from django.conf import settings

    servers = caches["default"]._cache._servers
    assert servers == [settings.CACHES["default"]["LOCATION"]], row("django-redis-cache-servers")


# --- Django's database backend (core/sql_batches.py, core/mysql/base.py) ----------------------------------------


@pytest.mark.django_db
def test_django_cursor_wrappers():
    import MySQLdb.cursors

    with connection.cursor() as cursor:
        assert isinstance(cursor.cursor, mysql_base.CursorWrapper), row("django-cursor-wrappers")
        assert isinstance(cursor.cursor.cursor, MySQLdb.cursors.Cursor), row("django-cursor-wrappers")


def test_django_cursor_steps():
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
    }, row("django-cursor-steps")
    assert "self.queries_logged" in inspect.getsource(BaseDatabaseWrapper._prepare_cursor), row("django-cursor-steps")
    assert parameters(mysql_base.DatabaseWrapper.create_cursor) == ["self", "name"], row("django-cursor-steps")
    assert isinstance(BaseDatabaseWrapper.queries_logged, property), row("django-cursor-steps")


@pytest.mark.django_db
def test_django_execute_wrappers():
    assert connection.execute_wrappers == [], row("django-execute-wrappers")
    with connection.execute_wrapper(wrapper := lambda execute, *args: execute(*args)):
        assert connection.execute_wrappers == [wrapper], row("django-execute-wrappers")
    assert isinstance(connection.in_atomic_block, bool), row("django-execute-wrappers")


def test_django_mysql_backend_hooks():
    base = mysql_base.DatabaseWrapper
    assert parameters(base.get_new_connection) == ["self", "conn_params"], row("django-mysql-backend-hooks")
    assert parameters(base.is_usable) == ["self"], row("django-mysql-backend-hooks")
    assert isinstance(BaseDatabaseWrapper.__dict__["wrap_database_errors"], cached_property)
    assert parameters(DatabaseErrorWrapper.__init__) == ["self", "wrapper"], row("django-mysql-backend-hooks")
    assert "self.wrapper" in inspect.getsource(DatabaseErrorWrapper.__exit__), row("django-mysql-backend-hooks")


@pytest.mark.django_db
def test_mysqlclient_driver_connection():
    galera_node(connection)  # keeps its answer in an attribute of ours on the driver connection
    driver = connection.connection
    assert isinstance(getattr(driver, _GALERA_NODE), bool), row("mysqlclient-driver-connection")
    for name in ("query", "store_result", "next_result", "affected_rows", "insert_id", "fileno"):
        assert callable(getattr(driver, name, None)), row("mysqlclient-driver-connection")
    driver.query("SELECT 1; SELECT 2")
    assert driver.store_result().fetch_row() == ((1,),), row("mysqlclient-driver-connection")
    assert driver.next_result() == 0 and driver.store_result().fetch_row() == ((2,),)
    assert driver.next_result() == -1, row("mysqlclient-driver-connection")


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
    body = [[], {"message": {"order_id": 7}}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}]
    message = kombu_message(json.dumps(body), {"id": "t-1", "task": AWARD_CREDITS_TASK, "x-mine": 1}, {})
    plain = Request(message, app=app, task=app.tasks[AWARD_CREDITS_TASK])
    assert plain._decoded is False and plain._body == message.body, row("celery-request")
    assert list(plain._payload) == body and plain._request_dict["x-mine"] == 1, row("celery-request")
    assert (plain.body, plain.content_type) == (plain._body, plain._content_type), row("celery-request")
    request = DecodedOnceRequest(message, app=app, task=app.tasks[AWARD_CREDITS_TASK])
    assert request.body == body and request.content_encoding is None, row("celery-request")
    assert set(vars(Context)) <= CELERY_REQUEST_KEYS and "headers" in vars(Context), row("celery-request")


def test_celery_message_protocol_2_award():
    headers, properties, body, _ = app.amqp.as_task_v2("t", AWARD_CREDITS_TASK, args=(), kwargs={}, kwargsrepr="")
    assert set(DEFAULT_VALUED_HEADERS) <= set(headers), row("celery-message-protocol-2")
    assert properties == {"correlation_id": "t", "reply_to": ""}, row("celery-message-protocol-2")
    assert body[:2] == ((), {}) and set(body[2]) == {"callbacks", "errbacks", "chain", "chord"}
    claimed = ClaimedMessage(
        id="01JINTERNALS00000000000000",
        payload={"order_id": 7},
        attempts=0,
        created_at=datetime(2026, 12, 1, tzinfo=UTC),
    )
    built = build_task_message(claimed)
    props = {"correlation_id": built.properties["correlation_id"], "reply_to": built.properties["reply_to"]}
    message = kombu_message(built.body, built.properties["application_headers"], props)
    assert "args" not in message.decode() and message.headers["task"] == AWARD_CREDITS_TASK  # the worker's v2 test
    request = Request(message, app=app, task=app.tasks[AWARD_CREDITS_TASK])
    assert (request.task_name, request.id) == (AWARD_CREDITS_TASK, claimed.id), row("celery-message-protocol-2")
    assert (request.args, request.kwargs) == ([], {"message": {"order_id": 7}}), row("celery-message-protocol-2")
    assert request.request_dict[CREATED_AT_HEADER] == claimed.created_at.timestamp(), row("celery-message-protocol-2")
    assert request.eta is None and request.expires is None, row("celery-message-protocol-2")


def test_celery_message_protocol_2_wakeup():
    headers, body = _wake_message()
    expires = datetime(2026, 12, 1, 12, tzinfo=UTC)
    headers = {**headers, "id": "w-1", "root_id": "w-1", "expires": expires.isoformat()}
    message = kombu_message(body, headers, {"correlation_id": "w-1", "reply_to": ""})
    request = Request(message, app=app, task=app.tasks[RELAY_TASK])
    assert (request.task_name, request.id) == (RELAY_TASK, "w-1"), row("celery-message-wakeup")
    assert (request.args, request.kwargs) == ([], {}), row("celery-message-wakeup")
    assert request.expires == expires, row("celery-message-wakeup")


# --- Celery: the worker's machinery (core/worker.py, core/beat.py) ----------------------------------------------


def test_celery_django_fixup():
    fixups = [fixup for fixup in app._fixups if isinstance(fixup, DjangoFixup)]
    assert len(fixups) == 1 and hasattr(fixups[0], "_worker_fixup"), row("celery-django-fixup")
    fresh = DjangoFixup(app)
    assert fresh._worker_fixup is None and fresh.worker_fixup is fresh._worker_fixup, row("celery-django-fixup")
    connects = inspect.getsource(DjangoWorkerFixup.install)
    assert "signals.task_prerun.connect(self.on_task_prerun)" in connects, row("celery-django-fixup")
    assert "signals.task_postrun.connect(self.on_task_postrun)" in connects, row("celery-django-fixup")


def test_celery_consumer_blueprint():
    steps = Consumer.Blueprint.default_steps
    assert "celery.worker.consumer.heart:Heart" in steps, row("celery-consumer-blueprint")
    assert "celery.worker.consumer.delayed_delivery:DelayedDelivery" in steps, row("celery-consumer-blueprint")
    assert parameters(Consumer.ensure_connected) == ["self", "conn"], row("celery-consumer-blueprint")
    assert "ensure_connection" in calls(Consumer.ensure_connected), row("celery-consumer-blueprint")
    assert parameters(DelayedDelivery.start) == ["self", "c"], row("celery-consumer-blueprint")


def test_celery_task_call():
    assert task_has_custom(app.tasks[AWARD_CREDITS_TASK], "__call__"), row("celery-task-call")
    assert isinstance(app.tasks[AWARD_CREDITS_TASK], WorkerTask), row("celery-task-call")
    stack = app.tasks[AWARD_CREDITS_TASK].request_stack
    assert stack.top is None and len(stack) == 0, row("celery-task-call")
    assert Context().called_directly is True and Context().is_eager is False, row("celery-task-call")


def test_celery_active_requests():
    assert hasattr(worker_state.active_requests, "add") and list(worker_state.active_requests) == []
    assert Request.worker_pid is None and isinstance(Request.task, property), row("celery-active-requests")


def test_celery_beat_connection():
    connection = inspect.getattr_static(PersistentScheduler, "connection")
    # Kept in the instance's __dict__ once read (functools' cached_property, which kombu's extends).
    assert isinstance(connection, functools.cached_property), row("celery-beat-connection")
    assert "super().close()" in inspect.getsource(PersistentScheduler.close), row("celery-beat-connection")
    assert "self.__dict__.pop('connection', None)" in inspect.getsource(Scheduler.close), row("celery-beat-connection")


# --- redis-py, Django REST framework, gunicorn, PySpark --------------------------------------------------------


def test_redis_connection_hooks():
    assert parameters(RedisConnection.connect) == ["self"], row("redis-connection-hooks")
    assert parameters(RedisConnection.send_packed_command) == ["self", "command", "check_health"]
    assert parameters(RedisConnection.read_response)[:2] == ["self", "disable_decoding"], row("redis-connection-hooks")
    assert "connection_class" in parameters(ConnectionPool.__init__), row("redis-connection-hooks")
    script = Script(None, b"return 1")
    assert parameters(script.__call__) == ["keys", "args", "client"], row("redis-connection-hooks")


def test_drf_throttle_state():
    source = inspect.getsource(SimpleRateThrottle)
    assert "self.num_requests, self.duration = self.parse_rate(self.rate)" in source, row("drf-throttle-state")
    assert "self.timer()" in source and "self.duration" in source, row("drf-throttle-state")
    assert SimpleRateThrottle.cache_format == "throttle_%(scope)s_%(ident)s", row("drf-throttle-state")


def test_drf_parser_encoding():
    assert parameters(parsers.get_encoding) == ["parser_context"], row("drf-parser-encoding")
    assert "get_encoding(parser_context)" in inspect.getsource(parsers.JSONParser.parse), row("drf-parser-encoding")


def test_drf_response_finalize():
    finalize = inspect.getsource(APIView.finalize_response)
    for name in ("accepted_renderer", "accepted_media_type", "renderer_context"):
        assert f"response.{name} = " in finalize, row("drf-response-finalize")
    assert "for key, value in self.headers.items():" in finalize, row("drf-response-finalize")
    initial = inspect.getsource(APIView.dispatch)
    assert "self.headers = self.default_response_headers" in initial, row("drf-response-finalize")
    assert isinstance(inspect.getattr_static(APIView, "default_response_headers"), property)
    rendered = inspect.getsource(Response.rendered_content.fget)
    for name in ("accepted_renderer", "accepted_media_type", "renderer_context"):
        assert f"getattr(self, '{name}', None)" in rendered, row("drf-response-finalize")


def test_gunicorn_thread_worker():
    from gunicorn.workers.gthread import ThreadWorker

    expected = {"enqueue_req": ["conn"], "finish_request": ["conn", "fs"], "set_accept_enabled": ["enabled"]}
    for name, names in {**expected, "accept": ["listener"]}.items():
        assert parameters(getattr(ThreadWorker, name))[1:] == names, row("gunicorn-thread-worker")
    assert "set_accept_enabled" in calls(ThreadWorker.run) | calls(ThreadWorker.finish_request)


def test_pyspark_jvm_gateway():
    from pyspark import SparkContext

    assert "_jvm" in vars(SparkContext), row("pyspark-jvm-gateway")
    assert "self._jsc = " in inspect.getsource(SparkContext), row("pyspark-jvm-gateway")


# --- the reference and the pins ---------------------------------------------------------------------------------


def doc_rows() -> dict[str, tuple[str, str, str]]:
    """Return each row's name -> (its package as requirements name it, the version tested, the range pinned)."""
    found = {}
    for line in DOC.read_text().splitlines():
        cells = [cell.strip().strip("`") for cell in line.strip().strip("|").split("|")]
        if len(cells) == 7 and re.fullmatch(r"[a-z][a-z0-9-]+", cells[0]) and cells[0] != "row":
            found[cells[0]] = (cells[1], cells[5], cells[6])
    return found


def test_every_row_has_its_test_and_every_test_its_row():
    tested = set(re.findall(r'row\("([a-z0-9-]+)"\)', Path(__file__).read_text()))
    assert set(doc_rows()) == tested


def in_requirements() -> dict[str, Requirement]:
    found = {}
    for name in ("base.in", "dev.in"):
        for line in (ROOT / "requirements" / name).read_text().splitlines():
            if line.strip() and not line.startswith(("#", "-")):
                requirement = Requirement(line)
                found[requirement.name.lower()] = requirement
    return found


def test_each_library_is_pinned_to_the_range_tested_and_the_installed_version_is_in_it():
    pins = in_requirements()
    for name, (package, tested, pinned) in doc_rows().items():
        requirement = pins.get(package.lower())
        assert requirement is not None, f"{package} (docs/LIBRARY_INTERNALS.md row `{name}`) is in no .in file"
        assert requirement.specifier == Requirement(f"{package}{pinned}").specifier, (
            f"requirements/*.in pins {requirement}; docs/LIBRARY_INTERNALS.md row `{name}` says {pinned}"
        )
        assert version(package) == tested, (
            f"{package} {version(package)} is installed; docs/LIBRARY_INTERNALS.md row `{name}` was tested on {tested}:"
            " run this file on it, then update the row"
        )
        assert requirement.specifier.contains(tested), f"row `{name}`: {tested} lies outside {pinned}"

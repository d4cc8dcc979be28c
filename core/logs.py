"""Log records that say which trace and which outbox transaction they belong to, as JSON when LOG_FORMAT=json.

Every record passing a handler gets ``trace_id``, ``span_id`` (the current span's, empty when tracing is off) and
``transaction_id`` (the one given as ``extra``, else the one bound to the current context, else empty). The JSON
formatter is python-json-logger's; settings.LOGGING wires both for Django's processes and ``celery_logging_install``
for the handlers Celery sets up in its workers.
"""

import contextlib
import logging
from collections.abc import Iterator
from contextvars import ContextVar

from django.core.signals import request_started

from core.tracing import current_ids

JSON_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s %(trace_id)s %(span_id)s %(transaction_id)s"

_transaction_id: ContextVar[str] = ContextVar("transaction_id", default="")


@contextlib.contextmanager
def transaction_bound(transaction_id: str) -> Iterator[None]:
    """Tag every record logged in the block (in this thread or task) with this outbox transaction id."""
    token = _transaction_id.set(transaction_id)
    try:
        yield
    finally:
        _transaction_id.reset(token)


def transaction_bind(transaction_id: str) -> None:
    """Tag the records logged from here to the end of the current request or task with this transaction id.

    For code that learns the id halfway through (the order request); the next request's start clears it, and a task
    that binds it unbinds it when its run ends (credits/tasks.py).
    """
    _transaction_id.set(transaction_id)


def transaction_unbind(**signal_kwargs) -> None:
    """Forget the transaction id bound to the current context (a new request starts, a task's run ends)."""
    _transaction_id.set("")


# A web thread serves request after request with the same context; the next request must not inherit an order's id.
request_started.connect(transaction_unbind, dispatch_uid="core.logs.transaction_unbind")


class TraceContextFilter(logging.Filter):
    """Add trace_id, span_id and transaction_id to every record; never drops one."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.trace_id, record.span_id = current_ids()
        if not getattr(record, "transaction_id", ""):
            record.transaction_id = _transaction_id.get()
        return True


def json_formatter() -> logging.Formatter:
    """Return the JSON formatter: one object per line with the standard fields and the three above."""
    from pythonjsonlogger.json import JsonFormatter

    return JsonFormatter(JSON_FORMAT, rename_fields={"levelname": "level", "name": "logger"})


def celery_logging_install(logger: logging.Logger, *, json_format: bool) -> None:
    """Give the handlers Celery attached to `logger` the trace filter, and the JSON formatter if asked."""
    for handler in logger.handlers:
        if not any(isinstance(f, TraceContextFilter) for f in handler.filters):
            handler.addFilter(TraceContextFilter())
        if json_format:
            handler.setFormatter(json_formatter())

"""Spans for Celery tasks in a worker: one consumer span per task run, one producer span per publish made by a task.

In place of opentelemetry-instrumentation-celery, whose span per task run costs more than the award's own span: it
copies up to nineteen request fields onto it (the delivery info as a string, time limits, reply queue,
...), reads the context through a generic getter and records a task-duration metric nobody reads here
(docs/PERFORMANCE.md, "Tracing overhead"). The spans and their names are the library's:

- ``run/<task name>`` (consumer): a child of the context the message's headers carry (W3C ``traceparent``,
  ``tracestate``), current while the task runs; marked as an error when it fails.
- ``apply_async/<task name>`` (producer): a publish made while a task runs (a retry), a child of the current span;
  its context goes into the published message's headers, so the run of that message is its child. In a trace that
  is sampled out, no span: the headers carry the current context on.

Attributes: ``celery.task_name``, ``messaging.message_id`` (the task id: the outbox transaction id) and, when not
zero, ``celery.retries``. Installed by the worker (core/worker.py) through core.tracing.tracing_setup(instrument=...).
"""

from collections.abc import Callable

from celery import signals
from opentelemetry import context, trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from core.tracing import TRACEPARENT, TRACESTATE, sampled_out

# W3C trace context only, as the outbox carries it (core.tracing): the process's OTEL_PROPAGATORS composite also
# looked for baggage in every message, which nothing here sends.
_PROPAGATOR = TraceContextTextMapPropagator()
# The spans in flight, by (task id, is a publish): a retry is published under the id of the task that is running.
_open: dict[tuple[str, bool], tuple[trace.Span, object]] = {}


def _message_context(request) -> context.Context | None:
    """Return the trace context a task's message carries (Celery exposes its headers as request attributes)."""
    traceparent = getattr(request, TRACEPARENT, None)
    if not isinstance(traceparent, str):
        return None
    carrier = {TRACEPARENT: traceparent}
    if isinstance(tracestate := getattr(request, TRACESTATE, None), str):
        carrier[TRACESTATE] = tracestate
    return _PROPAGATOR.extract(carrier)


def celery_spans_install(tracer: trace.Tracer) -> Callable[[], None]:
    """Connect the handlers making the spans above, with `tracer`, in this process; return what disconnects them."""

    def run_start(task_id=None, task=None, **kwargs) -> None:
        if task is None or task_id is None:
            return
        request = task.request
        parent = _message_context(request)
        attributes = {"celery.task_name": task.name, "messaging.message_id": task_id}
        if request.retries:
            attributes["celery.retries"] = request.retries
        span = tracer.start_span(f"run/{task.name}", context=parent, kind=SpanKind.CONSUMER, attributes=attributes)
        token = context.attach(trace.set_span_in_context(span, parent))
        _open[(task_id, False)] = (span, token)

    def run_end(task_id=None, **kwargs) -> None:
        # A publish whose broker call failed never sent after_task_publish: end its span with the task's.
        if (publish := _open.pop((task_id, True), None)) is not None:
            publish[0].end()
        if (run := _open.pop((task_id, False), None)) is not None:
            span, token = run
            span.end()
            context.detach(token)

    def run_failed(task_id=None, exception=None, sender=None, **kwargs) -> None:
        run = _open.get((task_id, False))
        if run is None or exception is None or isinstance(exception, getattr(sender, "throws", ())):
            return
        span = run[0]
        span.record_exception(exception)
        span.set_status(Status(StatusCode.ERROR, str(exception)))

    def run_retried(request=None, reason=None, **kwargs) -> None:
        run = _open.get((getattr(request, "id", None), False))
        if run is not None and reason is not None:
            run[0].set_attribute("celery.retry.reason", str(reason))

    def publish_start(sender=None, headers=None, **kwargs) -> None:
        task_id = (headers or {}).get("id")
        if task_id is None:
            return
        if sampled_out():
            # The message carries the trace on, still sampled out, with no span of its own.
            _PROPAGATOR.inject(headers)
            return
        span = tracer.start_span(
            f"apply_async/{sender}",
            kind=SpanKind.PRODUCER,
            attributes={"celery.task_name": str(sender), "messaging.message_id": task_id},
        )
        _PROPAGATOR.inject(headers, context=trace.set_span_in_context(span))
        _open[(task_id, True)] = (span, None)

    def publish_end(headers=None, **kwargs) -> None:
        if (publish := _open.pop(((headers or {}).get("id"), True), None)) is not None:
            publish[0].end()

    connected = (
        (signals.task_prerun, run_start),
        (signals.task_postrun, run_end),
        (signals.task_failure, run_failed),
        (signals.task_retry, run_retried),
        (signals.before_task_publish, publish_start),
        (signals.after_task_publish, publish_end),
    )
    for signal, handler in connected:
        signal.connect(handler, weak=False, dispatch_uid=f"core.celery_spans.{handler.__name__}")

    def uninstall() -> None:
        for signal, handler in connected:
            signal.disconnect(handler, dispatch_uid=f"core.celery_spans.{handler.__name__}")

    return uninstall

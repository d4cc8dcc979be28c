"""OpenTelemetry tracing for every process type: set up from the standard OTEL_* variables, off unless they ask.

Tracing is on in a process when ``tracing_setup`` ran there and the environment asks for an exporter:
``OTEL_TRACES_EXPORTER`` (``otlp``, ``console``; ``none`` turns it off) or, without it, an OTLP endpoint
(``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``). ``OTEL_SDK_DISABLED=true`` wins over both.
Everything else (service name, sampler, batch sizes, headers, timeouts) is read by the SDK itself from its usual
variables. Off, every helper here returns before touching OpenTelemetry, so the hot paths pay one boolean test.

Imports no app: the outbox writes and the relay, the credits worker and the admin use the same helpers.
"""

import contextlib
import logging
import os
from collections.abc import Callable, Iterable, Iterator

from django.core.exceptions import ImproperlyConfigured
from opentelemetry import trace
from opentelemetry.trace import Link, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

logger = logging.getLogger(__name__)

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
# W3C trace context limits: a version-00 traceparent is 55 characters, tracestate at most 32 list members.
TRACEPARENT_MAX = 55
TRACESTATE_MAX = 512

_PROPAGATOR = TraceContextTextMapPropagator()
_TRUE = {"1", "true", "yes", "on"}

# Set by tracing_setup; a child forked after it inherits them (see tracing_setup).
_state: dict = {"configured": False, "enabled": False, "tracer": None}


def tracing_requested(environ: dict | None = None) -> bool:
    """Return whether the OTEL_* variables ask for traces to be exported."""
    environ = os.environ if environ is None else environ
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() in _TRUE:
        return False
    exporters = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporters:
        return exporters != "none"
    return bool(
        environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
        or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    )


def tracing_enabled() -> bool:
    """Return whether this process records and exports spans."""
    return _state["enabled"]


def _span_exporters(environ) -> list:
    names = [name.strip() for name in environ.get("OTEL_TRACES_EXPORTER", "otlp").lower().split(",") if name.strip()]
    exporters = []
    for name in names:
        if name == "otlp":
            protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get(
                "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
            )
            if protocol.strip() != "http/protobuf":
                raise ImproperlyConfigured(
                    f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: only http/protobuf is installed (port 4318)"
                )
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporters.append(OTLPSpanExporter())
        elif name == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            exporters.append(ConsoleSpanExporter())
        else:
            raise ImproperlyConfigured(f"OTEL_TRACES_EXPORTER={name!r} is not one of otlp, console, none")
    return exporters


def tracing_setup(
    *,
    service_name: str,
    django: bool = False,
    sql: bool = True,
    instrument: Iterable[Callable[[trace.Tracer], object]] = (),
) -> bool:
    """Install the tracer provider and the instrumentations in this process if OTEL_* asks; return whether it did.

    `service_name` is the default for OTEL_SERVICE_NAME; `sql` adds a span per SQL statement; each of `instrument`
    is called with the process's tracer (a worker passes core.celery_spans.celery_spans_install). A second call changes
    nothing. Gunicorn workers import the WSGI module after the fork and Celery's prefork children run
    worker_process_init, so each sets itself up; a process that set up and then forks (gunicorn --preload) is fine
    too, since the SDK restarts its batch export thread in the child (os.register_at_fork).
    """
    if _state["configured"]:
        return _state["enabled"]
    _state["configured"] = True
    environ = os.environ
    if not tracing_requested(environ):
        return False

    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    # Resource.create reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; attributes given here would override them.
    attributes = {} if environ.get("OTEL_SERVICE_NAME", "").strip() else {SERVICE_NAME: service_name}
    # The sampler comes from OTEL_TRACES_SAMPLER / _ARG (default parentbased_always_on), batching from OTEL_BSP_*.
    provider = TracerProvider(resource=Resource.create(attributes))
    for exporter in _span_exporters(environ):
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    # One tracer for the process: the provider builds a new one on every call, which a span per statement would pay.
    _state["tracer"] = provider.get_tracer("creditshop")
    if sql:
        sql_spans_install(SqlSpans(_state["tracer"]))
    if django:
        from opentelemetry.instrumentation.django import DjangoInstrumentor

        DjangoInstrumentor().instrument(tracer_provider=provider)
    for install in instrument:
        install(_state["tracer"])
    _state["enabled"] = True
    logger.info("tracing on: exporting spans as %s", provider.resource.attributes.get(SERVICE_NAME))
    return True


def _tracer() -> trace.Tracer:
    return _state["tracer"]


def sampled_out() -> bool:
    """Return whether the current span is in a trace that is not recorded: then so would be any child of it.

    True for every standard sampler (parent-based ones follow the parent; a trace id ratio decides the same for
    every span of a trace; always_on records all), so a child that would not be recorded need not be made at all.
    """
    current = trace.get_current_span()
    return not current.is_recording() and current.get_span_context().is_valid


class SqlSpans:
    """A Django execute wrapper giving each SQL statement a client span, a child of the current span.

    In place of opentelemetry-instrumentation-mysqlclient (a proxy around every DB-API connection and cursor, a
    regular expression and seven attributes per statement): the same span name (the statement's first word) and
    the attributes a trace viewer shows (db.system, db.name, db.statement, net.peer.name), for less CPU
    (docs/PERFORMANCE.md, "Tracing overhead"). A statement whose trace is not being recorded (sampled out at the
    order request) gets no span at all.
    """

    def __init__(self, tracer: trace.Tracer):
        self.tracer = tracer

    def __call__(self, execute, sql, params, many, context):
        if sampled_out():
            return execute(sql, params, many, context)
        connection = context["connection"]
        settings_dict = connection.settings_dict
        attributes = {
            "db.system": connection.vendor,
            "db.name": settings_dict["NAME"],
            "db.statement": sql,
            "net.peer.name": settings_dict["HOST"] or "localhost",
        }
        name = sql.split(None, 1)[0] if sql else connection.vendor
        with self.tracer.start_as_current_span(name, kind=SpanKind.CLIENT, attributes=attributes):
            return execute(sql, params, many, context)


def sql_spans_install(wrapper: SqlSpans) -> None:
    """Trace every statement of every Django database connection in this process, those open already included."""
    from django.db import connections
    from django.db.backends.signals import connection_created

    def add(connection) -> None:
        # A connection object outlives its database connections: add the wrapper once, not at every reconnect.
        if not any(isinstance(existing, SqlSpans) for existing in connection.execute_wrappers):
            connection.execute_wrappers.append(wrapper)

    connection_created.connect(lambda sender, connection, **kwargs: add(connection), weak=False)
    for connection in connections.all(initialized_only=True):
        add(connection)


def current_trace_context() -> tuple[str, str]:
    """Return the (traceparent, tracestate) of the current span, or empty strings when there is none to carry."""
    if not tracing_enabled():
        return "", ""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier.get(TRACEPARENT, ""), carrier.get(TRACESTATE, "")[:TRACESTATE_MAX]


def span_context_of(traceparent: str, tracestate: str = "") -> trace.SpanContext | None:
    """Return the remote span context a stored or received traceparent names, or None if it names none."""
    if not traceparent:
        return None
    carrier = {TRACEPARENT: traceparent}
    if tracestate:
        carrier[TRACESTATE] = tracestate
    span_context = trace.get_current_span(_PROPAGATOR.extract(carrier)).get_span_context()
    return span_context if span_context.is_valid else None


def links_to(contexts: Iterable[tuple[str, str]]) -> list[Link]:
    """Return a link to each valid (traceparent, tracestate), for a span that acts on many traces' messages."""
    links = []
    for traceparent, tracestate in contexts:
        span_context = span_context_of(traceparent, tracestate)
        if span_context is not None:
            links.append(Link(span_context))
    return links


# What span() returns when there is no span to make: reusable, and cheaper to enter than a generator's context.
_NO_SPAN = contextlib.nullcontext()


def span(
    name: str,
    *,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: dict | None = None,
    linked_to: Iterable[tuple[str, str]] = (),
) -> contextlib.AbstractContextManager[trace.Span | None]:
    """Run the block in a new current span (a child of the current one), linked to the given trace contexts.

    Yields None when tracing is off or the current trace is not recorded (sampled out), so callers setting
    attributes on the way must check. Use it in the ``with`` statement itself: whether to make a span is decided
    when it is called.
    """
    if not tracing_enabled() or sampled_out():
        return _NO_SPAN
    return _span(name, kind=kind, attributes=attributes, linked_to=linked_to)


@contextlib.contextmanager
def _span(
    name: str, *, kind: SpanKind, attributes: dict | None, linked_to: Iterable[tuple[str, str]]
) -> Iterator[trace.Span]:
    with _tracer().start_as_current_span(name, kind=kind, attributes=attributes, links=links_to(linked_to)) as current:
        yield current


def current_ids() -> tuple[str, str]:
    """Return the current span's (trace id, span id) in hex, or empty strings when there is no recording span."""
    if not tracing_enabled():
        return "", ""
    span_context = trace.get_current_span().get_span_context()
    if not span_context.is_valid:
        return "", ""
    return trace.format_trace_id(span_context.trace_id), trace.format_span_id(span_context.span_id)

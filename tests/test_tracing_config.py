"""When tracing is on, and the helpers a process without it runs on the hot paths."""

import json
import logging
from types import SimpleNamespace

import pytest
from celery import signals
from django.db import connections
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags

from core import tracing
from core.celery_spans import celery_spans_install
from core.logs import TraceContextFilter, json_formatter, transaction_bound


@pytest.mark.parametrize(
    ("environ", "requested"),
    [
        ({}, False),
        ({"OTEL_SERVICE_NAME": "x", "OTEL_TRACES_SAMPLER": "always_on"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, False),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, False),
        ({"OTEL_SDK_DISABLED": "false", "OTEL_TRACES_EXPORTER": "otlp"}, True),
    ],
)
def test_tracing_is_on_only_when_an_exporter_or_endpoint_is_configured(environ, requested):
    assert tracing.tracing_requested(environ) is requested


def test_without_tracing_nothing_is_carried_or_linked():
    assert not tracing.tracing_enabled()
    assert tracing.current_trace_context() == ("", "")
    assert tracing.current_ids() == ("", "")
    with tracing.span("anything", linked_to=[("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "")]) as s:
        assert s is None


def test_a_stored_traceparent_becomes_a_link_and_garbage_does_not():
    links = tracing.links_to(
        [("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "vendor=1"), ("", ""), ("not-a-traceparent", "")]
    )

    assert len(links) == 1
    assert links[0].context.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    assert links[0].context.is_remote


def test_json_log_records_carry_trace_span_and_transaction_ids():
    record = logging.LogRecord("creditshop", logging.WARNING, __file__, 1, "award failed for %s", ("x",), None)
    with transaction_bound("f" * 32):
        assert TraceContextFilter().filter(record)

    line = json.loads(json_formatter().format(record))

    assert line["message"] == "award failed for x"
    assert line["level"] == "WARNING"
    assert (line["trace_id"], line["span_id"], line["transaction_id"]) == ("", "", "f" * 32)


def test_a_transaction_id_given_as_extra_wins_over_the_bound_one():
    record = logging.LogRecord("creditshop", logging.ERROR, __file__, 1, "dead", (), None)
    record.transaction_id = "e" * 32
    with transaction_bound("f" * 32):
        TraceContextFilter().filter(record)

    assert record.transaction_id == "e" * 32


@pytest.mark.django_db
def test_each_statement_gets_a_client_span_under_the_current_one_unless_its_trace_is_sampled_out():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    sampled_out = NonRecordingSpan(SpanContext(trace_id=1, span_id=2, is_remote=True, trace_flags=TraceFlags(0)))
    connection = connections["credits"]

    with connection.execute_wrapper(tracing.SqlSpans(tracer)), connection.cursor() as cursor:
        with tracer.start_as_current_span("credits.award") as award:
            cursor.execute("SELECT %s", [1])
        with trace.use_span(sampled_out):
            cursor.execute("SELECT %s", [2])

    statement, parent = exporter.get_finished_spans()
    assert (statement.name, statement.kind, parent.name) == ("SELECT", SpanKind.CLIENT, "credits.award")
    assert statement.parent.span_id == award.get_span_context().span_id
    assert statement.attributes["db.statement"] == "SELECT %s"
    assert statement.attributes["db.system"] == "mysql"
    assert statement.attributes["db.name"] == connection.settings_dict["NAME"]


def test_a_task_run_continues_its_messages_trace_and_a_publish_from_it_carries_its_own_span():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))

    class Task:  # what the handlers read of a task; eager, so the worker's connection handlers leave it alone
        name = "credits.award_credits"
        request = SimpleNamespace(
            traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", retries=1, is_eager=True
        )

    task = Task()
    headers = {"id": "t1"}
    uninstall = celery_spans_install(provider.get_tracer("test"))
    try:
        signals.task_prerun.send(sender=task, task_id="t1", task=task)
        signals.before_task_publish.send(sender=task.name, headers=headers)
        signals.after_task_publish.send(sender=task.name, headers=headers)
        signals.task_postrun.send(sender=task, task_id="t1", task=task, state="SUCCESS")
    finally:
        uninstall()

    publish, run = exporter.get_finished_spans()
    assert (run.name, run.kind) == ("run/credits.award_credits", SpanKind.CONSUMER)
    assert run.context.trace_id == 0x0AF7651916CD43DD8448EB211C80319C and run.parent.span_id == 0xB7AD6B7169203331
    assert run.attributes["messaging.message_id"] == "t1" and run.attributes["celery.retries"] == 1
    assert (publish.name, publish.kind, publish.parent.span_id) == (
        "apply_async/credits.award_credits",
        SpanKind.PRODUCER,
        run.context.span_id,
    )
    # The published message continues the trace from the publish span.
    assert headers["traceparent"] == f"00-{run.context.trace_id:032x}-{publish.context.span_id:016x}-01"
    assert trace.get_current_span() is trace.INVALID_SPAN


def test_in_a_sampled_out_trace_a_run_makes_no_child_spans_and_a_publish_carries_the_trace_on():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))

    class Task:
        name = "credits.award_credits"
        request = SimpleNamespace(
            traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00", retries=0, is_eager=True
        )

    task = Task()
    headers = {"id": "t2"}
    uninstall = celery_spans_install(provider.get_tracer("test"))
    try:
        signals.task_prerun.send(sender=task, task_id="t2", task=task)
        assert tracing.sampled_out()
        signals.before_task_publish.send(sender=task.name, headers=headers)
        signals.after_task_publish.send(sender=task.name, headers=headers)
        signals.task_postrun.send(sender=task, task_id="t2", task=task, state="SUCCESS")
    finally:
        uninstall()

    assert exporter.get_finished_spans() == ()
    assert (
        headers["traceparent"].startswith("00-0af7651916cd43dd8448eb211c80319c-")
        and headers["traceparent"][-3:] == "-00"
    )
    assert not tracing.sampled_out()

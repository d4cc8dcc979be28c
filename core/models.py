"""Model fields more than one app keeps in the same shape."""

from django.db import models

from core.tracing import TRACEPARENT_MAX, TRACESTATE_MAX


def trace_context_fields() -> tuple[models.CharField, models.CharField]:
    """Return new (traceparent, tracestate) fields: a W3C trace context kept with a row, empty when tracing is off.

    Database defaults too, so code from before these columns can still insert rows while a deploy rolls out.
    """
    return (
        models.CharField(max_length=TRACEPARENT_MAX, blank=True, default="", db_default="", db_collation="ascii_bin"),
        models.CharField(max_length=TRACESTATE_MAX, blank=True, default="", db_default="", db_collation="ascii_bin"),
    )

"""Model fields more than one app keeps in the same shape."""

from django.db import models

from core.tracing import TRACEPARENT_MAX, TRACESTATE_MAX


def trace_context_fields(*, db_default: bool = True) -> tuple[models.CharField, models.CharField]:
    """Return new (traceparent, tracestate) fields: a W3C trace context kept with a row, empty when tracing is off.

    With `db_default`, the database defaults them too, so code from before these columns can still insert rows while
    a deploy rolls out (only for tables of the default database: see credits/models.py).
    """
    defaults = {"blank": True, "default": "", "db_collation": "ascii_bin"} | ({"db_default": ""} if db_default else {})
    return (
        models.CharField(max_length=TRACEPARENT_MAX, **defaults),
        models.CharField(max_length=TRACESTATE_MAX, **defaults),
    )

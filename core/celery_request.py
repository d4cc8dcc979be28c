"""A Celery worker request that does its per-message work once: for the tasks run per message on the hot path.

Celery's worker decodes each message's JSON body when the message arrives (to tell its protocol versions apart and
to log the arguments) and, by default, again from the raw bytes when the task runs. This request hands the task run
the body already decoded, as Celery does itself for the messages it converts from older protocols (``decoded``):
the run then unpacks it without a second parse. The accepted content types were checked by the first decode.

It also hands the task's context the message's own headers (``request.headers``: those Celery does not know, such as
the relay's creation time and trace context), which the context would otherwise work out on every run by building
the set of every key Celery knows and removing each from a copy of the request, on every award. Here the set is
built once and the headers picked in one pass; a message that names its headers itself (a ``headers`` key) keeps
them, as the context would.
Opt in per task: ``@shared_task(Request="core.celery_request:DecodedOnceRequest")``.
"""

from celery.app.task import Context
from celery.worker.request import Request

# The keys of a request that are Celery's, not the message's own: as celery.app.task.Context counts them.
CELERY_REQUEST_KEYS = frozenset({*Context.__dict__, "lang", "task", "argsrepr", "kwargsrepr", "compression"})


class DecodedOnceRequest(Request):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not self._decoded:
            self._body, self._decoded = self._payload, True
            self._content_type = self._content_encoding = None
        request = self._request_dict
        if request.get("headers") is None:
            request["headers"] = {
                key: value for key, value in request.items() if key not in CELERY_REQUEST_KEYS
            } or None

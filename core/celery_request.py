"""A Celery worker request that decodes its message's body once: for the tasks run per message on the hot path.

Celery's worker decodes each message's JSON body when the message arrives (to tell its protocol versions apart and
to log the arguments) and, by default, again from the raw bytes when the task runs. This request hands the task run
the body already decoded, as Celery does itself for the messages it converts from older protocols (``decoded``):
the run then unpacks it without a second parse. The accepted content types were checked by the first decode.
Opt in per task: ``@shared_task(Request="core.celery_request:DecodedOnceRequest")``.
"""

from celery.worker.request import Request


class DecodedOnceRequest(Request):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not self._decoded:
            self._body, self._decoded = self._payload, True
            self._content_type = self._content_encoding = None

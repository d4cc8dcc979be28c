"""What every Celery message this app publishes leaves out, whoever publishes it (web, beat, a retrying worker).

Since Celery 5.7, `send_task` and `apply_async` stamp the publishing process's time limits into the message (its
`timelimit` header) when the task is registered there, and a worker obeys a message's limits over its own settings.
The limits would then be those of whichever process published: beat's for the nightly run, the retrying worker's for
a retry. Left out, the worker that runs the task applies its own (CELERY_TASK_SOFT_TIME_LIMIT, CELERY_TASK_TIME_LIMIT,
CELERY_TASK_ANNOTATIONS), as the relay's messages already do (outbox/messages.py leaves the header out).
"""


def time_limits_left_to_workers(headers=None, **kwargs) -> None:
    """Drop the `timelimit` header of a task message about to be published (Celery's before_task_publish)."""
    if headers is not None:
        headers.pop("timelimit", None)

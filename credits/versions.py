"""Where a credits message goes when this consumer does not award it for its version, and where one is sent again.

Messages reach a consumer by version (core/credits_queues.py), so a version it does not accept reaches it only two
ways, each handled here:
- On `credits`, from a relay of the release before routing (it published every version there) or a consumer of that
  release handing a message back: it is forwarded, once and at once, to its version's queue, to wait there for a
  consumer that accepts it, as if a relay of this release had published it.
- On credits.expired, having waited out CREDITS_UNKNOWN_VERSION_WAIT_SECONDS in its version's queue: it is
  dead-lettered (version_not_supported), unless this consumer accepts its version, and then it is awarded.
credits.expired also receives what a consumer dead-lettered from a version's queue, its dead letter recorded then:
that passes on to credits.dead untouched.
"""

import logging
import re

from celery import Task
from celery.exceptions import Reject

from core import tracing
from core.contract import CREDITS_EXPIRED_QUEUE, CREDITS_QUEUE, credits_queue_name
from core.credits_queues import queue_for, wait_expiration_seconds
from credits import metrics
from credits.headers import header
from credits.messages import accepted_versions

logger = logging.getLogger(__name__)

# Set by RabbitMQ on a dead-lettered message: why it left the queue it was first dead-lettered from.
FIRST_DEATH_REASON_HEADER = "x-first-death-reason"
FIRST_DEATH_QUEUE_HEADER = "x-first-death-queue"
EXPIRED = "expired"
# Native delayed delivery (quorum queues) prefixes a routing key with the delay's bits, one word each.
_DELAY_PREFIX = re.compile(r"^(?:[01]\.)+")


def delivery_queue(request) -> str:
    """Return the credits queue this delivery came from (its routing key, which names it), `credits` if unknown."""
    routing_key = (request.delivery_info or {}).get("routing_key") or CREDITS_QUEUE
    return _DELAY_PREFIX.sub("", routing_key, count=1)


def waited(request) -> bool:
    """Return whether this message comes from credits.expired: it waited its time in its version's queue."""
    return delivery_queue(request) == CREDITS_EXPIRED_QUEUE


def dead_lettered_before(request) -> bool:
    """Return whether a consumer (or the broker's delivery limit) already dead-lettered this message from its queue.

    Only what expired in a version's queue waited; a message sent again to credits.expired during an outage carries
    no death header and waited too.
    """
    # The header first: absent on every message never dead-lettered, so the common award pays one look-up.
    reason = header(request, FIRST_DEATH_REASON_HEADER)
    return isinstance(reason, str) and reason != EXPIRED and waited(request)


def pass_on(request, exc: Exception | None = None) -> Reject:
    """Return the Reject that sends a message already dead-lettered on to credits.dead, nothing recorded again."""
    queue = header(request, FIRST_DEATH_QUEUE_HEADER)
    reason = header(request, FIRST_DEATH_REASON_HEADER)
    logger.info("credits message %s passed on to credits.dead: dead-lettered from %s (%s)", request.id, queue, reason)
    return Reject(f"dead-lettered from {queue} ({reason})", requeue=False)


def resend_queue(request, payload) -> str:
    """Return the queue a message goes to when it is sent again (a retry, an outage): its version's, if this consumer
    takes that, so a consumer that accepts it gets it; else the one it came from."""
    version = payload.get("schema_version") if isinstance(payload, dict) else None
    if version in accepted_versions():
        return credits_queue_name(version)
    return delivery_queue(request)


def waited_error(request) -> str:
    """Return what a dead letter of a message that waited out its version's queue says about the wait."""
    queue = header(request, FIRST_DEATH_QUEUE_HEADER) or "its version's queue"
    return f"no consumer that accepts it took it from {queue} within CREDITS_UNKNOWN_VERSION_WAIT_SECONDS"


def forward(task: Task, request, payload: dict, exc: Exception, *, headers: dict) -> str:
    """Publish a message that came on `credits` to its version's queue, its retries and headers unchanged.

    Returns what the task returns: the delivery in hand is then acknowledged. If the publish fails, the delivery goes
    back to `credits` instead (Reject requeue), to be forwarded again.
    """
    name = credits_queue_name(payload.get("schema_version"))
    if request.is_eager:
        raise Reject(f"{exc}; not awarded here, for a consumer of {name}", requeue=True) from exc
    again = task.signature_from_request(
        request,
        queue=queue_for(name),
        retries=request.retries,
        headers=headers,
        expiration=wait_expiration_seconds(name),
    )
    with tracing.span("credits.forward", attributes={"credits.queue": name}):
        try:
            again.apply_async()
        except Exception as publish_exc:  # the delivery stays unacknowledged, so `credits` keeps it
            raise Reject(f"{exc}; forwarding to {name} failed: {publish_exc}", requeue=True) from exc
    metrics.VERSION_FORWARDS.inc()
    logger.warning("credits message %s forwarded to %s for a consumer that accepts it: %s", request.id, name, exc)
    return "forwarded"

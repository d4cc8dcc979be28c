"""The credits queues, one per message version: how each is declared, which a consumer takes, how long one waits.

Routing by version (docs/ARCHITECTURE.md, "Message versions"): the relay publishes each credits message to the
`credits` exchange with its version's queue name as routing key (core.contract.credits_queue_name: `credits` for
version 1, `credits.vN` after). Every version's queue is durable and declared like `credits` (type, delivery limit,
dead-lettering to credits.dead through credits.dlx), and a consumer takes the queues of the versions it accepts, so
it never receives a version it does not. A message whose version no running consumer accepts waits in its queue,
costing nothing, until one starts. It waits at most CREDITS_UNKNOWN_VERSION_WAIT_SECONDS: the relay gives it that as
its time to live, and once it runs out the broker dead-letters it to credits.expired, which every consumer takes.
There a consumer that accepts the version awards it (it only waited behind a backlog, a long credits database outage
say); any other records the version_not_supported dead letter. So a version queue dead-letters into credits.expired,
not straight to credits.dead: what a consumer rejected from it (its dead letter already recorded) passes on from
there to credits.dead untouched (credits/versions.py).
"""

from celery import current_app
from django.conf import settings
from kombu import Exchange, Queue

from core.contract import (
    CREDITS_DEAD_EXCHANGE,
    CREDITS_DEAD_QUEUE,
    CREDITS_EXPIRED_QUEUE,
    CREDITS_QUEUE,
    QUEUE_TYPE_QUORUM,
    SCHEMA_VERSIONS,
    credits_queue_name,
)

# What the name of a later version's queue begins with (core.contract.credits_queue_name).
VERSION_QUEUE_PREFIX = f"{CREDITS_QUEUE}.v"


def credits_queue(name: str, *, queue_type: str, max_retries: int) -> Queue:
    """Return the declaration of one credits queue: `credits`, a version's `credits.vN`, or credits.expired.

    Each is bound to the `credits` exchange under its own name. Those a consumer rejects to are dead-lettered by the
    broker: `credits` and credits.expired to credits.dead (through credits.dlx), a version's queue to credits.expired.
    On quorum queues the dead-lettering is at-least-once and the delivery limit agrees with CREDITS_MAX_RETRIES
    (config/celery.py says why).
    """
    quorum = queue_type == QUEUE_TYPE_QUORUM
    # Native delayed delivery (quorum) holds a retry's delay in the broker and skips direct exchanges.
    exchange = Exchange(CREDITS_QUEUE, type="topic" if quorum else "direct", durable=True)
    if name in (CREDITS_QUEUE, CREDITS_EXPIRED_QUEUE):
        arguments = {"x-dead-letter-exchange": CREDITS_DEAD_EXCHANGE, "x-dead-letter-routing-key": CREDITS_DEAD_QUEUE}
    else:
        arguments = {"x-dead-letter-exchange": CREDITS_QUEUE, "x-dead-letter-routing-key": CREDITS_EXPIRED_QUEUE}
    if quorum:
        arguments |= {
            "x-queue-type": QUEUE_TYPE_QUORUM,
            "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish",
            "x-delivery-limit": max_retries + 1,
        }
    return Queue(name, exchange, routing_key=name, queue_arguments=arguments)


def credits_queues(*, queue_type: str, max_retries: int) -> tuple[Queue, ...]:
    """Return `credits`, the queue of every later version this code knows, and credits.expired."""
    names = [credits_queue_name(version) for version in sorted(SCHEMA_VERSIONS)]
    return tuple(
        credits_queue(name, queue_type=queue_type, max_retries=max_retries)
        for name in (*dict.fromkeys(names), CREDITS_EXPIRED_QUEUE)
    )


def consumed_queue_names(accepted_versions) -> list[str]:
    """Return the queues a credits consumer accepting these versions takes.

    `credits` always: version 1's, and where relays and consumers of the release before put every version (the move
    to routing loses nothing while they run); credits.expired always: any consumer records a dead letter there.
    """
    names = [CREDITS_QUEUE, *(credits_queue_name(version) for version in sorted(accepted_versions))]
    return [*dict.fromkeys(names), CREDITS_EXPIRED_QUEUE]


def queue_for(name: str) -> Queue:
    """Return the declaration of a credits queue, a version's this code does not know yet included."""
    queues = current_app.amqp.queues
    if name in queues:
        return queues[name]
    return credits_queue(name, queue_type=settings.CELERY_QUEUE_TYPE, max_retries=settings.CREDITS_MAX_RETRIES)


def wait_expiration_seconds(name: str) -> float | None:
    """Return the time to live of a message published to this queue: the version wait for a later version's queue.

    None for any other: `credits` has consumers whenever any consumer runs (every one takes it), and what it holds is
    dead-lettered straight to credits.dead, where nobody would record a dead letter; a message there never expires.
    """
    if not name.startswith(VERSION_QUEUE_PREFIX):
        return None
    return settings.CREDITS_UNKNOWN_VERSION_WAIT_SECONDS

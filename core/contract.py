"""What the order service and the credits service agree on: the message that crosses between them, and its names.

The message is the only thing the two services share, so everything both sides must spell alike has its home here:
the business name and schema version of an order's message, the transaction-id format, the bounds of an order's
total, the queues and task names on the broker, and the header the relay adds. Imports nothing of the project.
"""

import re

# transaction_log.business of an order's message (docs/CONTRACT.md, "Tables").
BUSINESS_ORDER = "order"
# The payload's schema_version. The rule (docs/ARCHITECTURE.md, "Message versions"): a version only adds fields, and
# never changes what an existing field means; a new meaning is a new version.
# Version 1: schema_version, transaction_id, order_id, user_id, total.
SCHEMA_VERSION_1 = 1
# Version 2: version 1's fields and ordered_at, the order's created_at (ISO 8601, UTC): a credit dated by its order.
SCHEMA_VERSION_2 = 2
ORDERED_AT_FIELD = "ordered_at"
# Every version this code can write and read. The order service writes ORDER_MESSAGE_VERSION; a credits consumer
# reads CREDITS_ACCEPTED_MESSAGE_VERSIONS, and takes only those versions' queues (credits_queue_name below).
SCHEMA_VERSIONS = (SCHEMA_VERSION_1, SCHEMA_VERSION_2)
# What a message carries when nothing says otherwise (tools and benchmarks that write messages of their own).
SCHEMA_VERSION = SCHEMA_VERSION_1
# A transaction id: 48 bits of Unix milliseconds and 80 random bits, as 32 lowercase hex digits (outbox.ids).
TRANSACTION_ID_LENGTH = 32
TRANSACTION_ID = re.compile(rf"[0-9a-f]{{{TRANSACTION_ID_LENGTH}}}")
# An order's total (quantity), as the API accepts it, the orders table constrains it and the consumer trusts it.
ORDER_TOTAL_MIN, ORDER_TOTAL_MAX = 1, 10_000

# Broker topology (declared by config/celery.py).
OUTBOX_QUEUE = "outbox"
# Version 1's queue, and every message a relay of a release before routing by version publishes (any version).
CREDITS_QUEUE = "credits"
# Where a message that waited out CREDITS_UNKNOWN_VERSION_WAIT_SECONDS in its version's queue goes (the broker
# dead-letters it there), with anything else a version queue dead-letters; every credits consumer takes it.
CREDITS_EXPIRED_QUEUE = "credits.expired"
CREDITS_DEAD_QUEUE = "credits.dead"
CREDITS_DEAD_EXCHANGE = "credits.dlx"


def credits_queue_name(version: object) -> str:
    """Return the queue (and routing key) of a credits message of this schema_version.

    Version 1 keeps the queue every release has had, so relays and consumers of the release before and after routing
    by version agree on it; version N >= 2 has `credits.vN`. Anything that is not a version goes to `credits`, where
    a consumer dead-letters it as malformed.
    """
    if isinstance(version, int) and not isinstance(version, bool) and version >= 2:
        return f"{CREDITS_QUEUE}.v{version}"
    return CREDITS_QUEUE


# The nightly run holds its worker for the whole Spark job (hours on a big day): on a queue of its own, with a
# worker of its own, it can never stall the relay's wake-ups, sweeps and retention on `outbox`.
ANALYTICS_QUEUE = "analytics"
QUEUE_TYPE_CLASSIC = "classic"
QUEUE_TYPE_QUORUM = "quorum"

# A credits message header set by the relay: when its outbox row was written (Unix seconds), i.e. the order's commit
# give or take the transaction's few milliseconds; the consumer measures the end-to-end latency from it.
CREATED_AT_HEADER = "creditshop_created_at"

# Celery task names: the tasks declare them, the relay and the wake-ups send them, beat schedules them.
AWARD_CREDITS_TASK = "credits.award_credits"
RELAY_TASK = "outbox.relay"
SWEEP_TASK = "outbox.sweep"
PURGE_PUBLISHED_TASK = "outbox.purge_published"
PURGE_IDEMPOTENCY_KEYS_TASK = "orders.purge_idempotency_keys"
RUN_NIGHTLY_TASK = "analytics.run_nightly"

"""The order message: what the order service writes to transaction_log for the credits service, in which version.

The fields of each version are in core/contract.py; ORDER_MESSAGE_VERSION picks the version written, raised only once
every credits consumer accepts it (docs/OPERATIONS.md, "Deploying a new version").
"""

from datetime import datetime

from django.conf import settings

from core.contract import ORDERED_AT_FIELD, SCHEMA_VERSION_2


def order_message_payload(*, order_id: int, user_id: int, total: int, created_at: datetime) -> dict:
    """Return an order's message payload, in the version ORDER_MESSAGE_VERSION says (the outbox adds transaction_id)."""
    version = settings.ORDER_MESSAGE_VERSION
    payload = {"schema_version": version, "order_id": order_id, "user_id": user_id, "total": total}
    if version >= SCHEMA_VERSION_2:
        payload[ORDERED_AT_FIELD] = created_at.isoformat()
    return payload

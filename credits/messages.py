"""The credits message: the transaction_log payload the relay publishes, parsed and checked before anything runs."""

from dataclasses import dataclass
from typing import Any

from core.contract import ORDER_TOTAL_MAX, ORDER_TOTAL_MIN, SCHEMA_VERSION, TRANSACTION_ID
from credits.errors import MalformedMessage, UnsupportedSchemaVersion

SUPPORTED_SCHEMA_VERSIONS = frozenset({SCHEMA_VERSION})


@dataclass(frozen=True)
class AwardMessage:
    transaction_id: str
    order_id: int
    user_id: int
    total: int


def _is_int(value: Any) -> bool:
    # JSON true/false decode to Python bools, which are ints; a boolean is never a valid id or total.
    return isinstance(value, int) and not isinstance(value, bool)


def _show(value: Any) -> str:
    # Error texts end up in logs and the admin; a hostile payload must not make them huge.
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def award_message_parse(payload: Any) -> AwardMessage:
    """Return the award a payload asks for, or raise MalformedMessage / UnsupportedSchemaVersion.

    Keys this version does not know are ignored, so a producer may add fields without breaking consumers.
    """
    if not isinstance(payload, dict):
        raise MalformedMessage(f"message must be a JSON object, got {type(payload).__name__}")
    version = payload.get("schema_version")
    if not _is_int(version):
        raise MalformedMessage(f"schema_version must be an integer, got {_show(version)}")
    if version not in SUPPORTED_SCHEMA_VERSIONS:
        raise UnsupportedSchemaVersion(f"schema_version {_show(version)} is not supported")
    errors = []
    transaction_id = payload.get("transaction_id")
    if not isinstance(transaction_id, str) or not TRANSACTION_ID.fullmatch(transaction_id):
        errors.append(f"transaction_id must be 32 lowercase hex characters, got {_show(transaction_id)}")
    for key in ("order_id", "user_id"):
        value = payload.get(key)
        if not _is_int(value) or value < 1:
            errors.append(f"{key} must be a positive integer, got {_show(value)}")
    total = payload.get("total")
    if not _is_int(total) or not ORDER_TOTAL_MIN <= total <= ORDER_TOTAL_MAX:
        errors.append(f"total must be an integer in [{ORDER_TOTAL_MIN}, {ORDER_TOTAL_MAX}], got {_show(total)}")
    if errors:
        raise MalformedMessage("; ".join(errors))
    return AwardMessage(
        transaction_id=transaction_id, order_id=payload["order_id"], user_id=payload["user_id"], total=total
    )

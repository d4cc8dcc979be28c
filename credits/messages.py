"""The credits message: the transaction_log payload the relay publishes, parsed and checked before anything runs."""

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings

from core.contract import (
    ORDER_TOTAL_MAX,
    ORDER_TOTAL_MIN,
    ORDERED_AT_FIELD,
    SCHEMA_VERSION_2,
    TRANSACTION_ID,
)
from credits.errors import MalformedMessage, NewerSchemaVersion, UnsupportedSchemaVersion


@dataclass(frozen=True)
class AwardMessage:
    transaction_id: str
    order_id: int
    user_id: int
    total: int
    # When the order was placed (version 2 on); None from a version-1 message.
    ordered_at: datetime | None = None


def _is_int(value: Any) -> bool:
    # JSON true/false decode to Python bools, which are ints; a boolean is never a valid id or total.
    return isinstance(value, int) and not isinstance(value, bool)


def _show(value: Any) -> str:
    # Error texts end up in logs and the admin; a hostile payload must not make them huge.
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def accepted_versions() -> frozenset[int]:
    """Return the schema versions this consumer accepts (CREDITS_ACCEPTED_MESSAGE_VERSIONS)."""
    return settings.CREDITS_ACCEPTED_MESSAGE_VERSIONS


def _ordered_at_parse(value: Any, errors: list[str]) -> datetime | None:
    parsed = None
    if isinstance(value, str) and len(value) <= 64:
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            parsed = None
    if parsed is None or parsed.tzinfo is None:
        errors.append(f"{ORDERED_AT_FIELD} must be an ISO 8601 date and time with a UTC offset, got {_show(value)}")
        return None
    return parsed


def award_message_parse(payload: Any) -> AwardMessage:
    """Return the award a payload asks for, or raise MalformedMessage / UnsupportedSchemaVersion / NewerSchemaVersion.

    A version newer than every accepted one raises NewerSchemaVersion (a newer consumer may know it); an accepted
    version is read by its own rules; any other (older, or a gap in the accepted ones) is unsupported for good.
    Keys a version does not define are ignored, so a producer may add fields without breaking consumers.
    """
    if not isinstance(payload, dict):
        raise MalformedMessage(f"message must be a JSON object, got {type(payload).__name__}")
    version = payload.get("schema_version")
    if not _is_int(version):
        raise MalformedMessage(f"schema_version must be an integer, got {_show(version)}")
    accepted = accepted_versions()
    if version > max(accepted):
        raise NewerSchemaVersion(f"schema_version {version} is newer than this consumer accepts ({sorted(accepted)})")
    if version not in accepted:
        raise UnsupportedSchemaVersion(f"schema_version {version} is not supported (accepted: {sorted(accepted)})")
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
    ordered_at = None
    if version >= SCHEMA_VERSION_2:
        ordered_at = _ordered_at_parse(payload.get(ORDERED_AT_FIELD), errors)
    if errors:
        raise MalformedMessage("; ".join(errors))
    return AwardMessage(
        transaction_id=transaction_id,
        order_id=payload["order_id"],
        user_id=payload["user_id"],
        total=total,
        ordered_at=ordered_at,
    )

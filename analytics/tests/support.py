"""Helpers the analytics tests share."""

from datetime import UTC, datetime


def at(day: int, hour: int = 12, minute: int = 0, second: int = 0, *, month: int = 11) -> datetime:
    """An instant in November 2026, UTC."""
    return datetime(2026, month, day, hour, minute, second, tzinfo=UTC)

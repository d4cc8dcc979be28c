"""Counts per minute over a time window, the series behind the small charts of the last hour."""

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Count, QuerySet
from django.db.models.functions import TruncMinute

MINUTE = timedelta(minutes=1)


@dataclass(frozen=True)
class Minutes:
    """Whole minutes ending with the one `now` is in: the current, partial minute is the last."""

    first: datetime
    count: int

    @classmethod
    def ending(cls, now: datetime, *, count: int = 60) -> "Minutes":
        current = now.replace(second=0, microsecond=0)
        return cls(first=current - (count - 1) * MINUTE, count=count)

    @property
    def starts(self) -> list[datetime]:
        return [self.first + i * MINUTE for i in range(self.count)]


def counts_per_minute(queryset: QuerySet, *, field: str, minutes: Minutes) -> list[int]:
    """Return how many rows of the queryset have `field` in each of the minutes, oldest first (one GROUP BY)."""
    rows = (
        queryset.filter(**{f"{field}__gte": minutes.first, f"{field}__lt": minutes.first + minutes.count * MINUTE})
        .annotate(minute=TruncMinute(field))
        .values("minute")
        .annotate(n=Count("*"))
        .values_list("minute", "n")
        .order_by()
    )
    found = dict(rows)
    return [found.get(start, 0) for start in minutes.starts]

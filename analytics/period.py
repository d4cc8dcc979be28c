"""The days a nightly run reports on, as UTC instants."""

from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta


@dataclass(frozen=True)
class Period:
    """Whole UTC days `first`..`last`, inclusive."""

    first: date
    last: date

    def __post_init__(self) -> None:
        if self.first > self.last:
            raise ValueError(f"period starts {self.first} after it ends {self.last}")

    @classmethod
    def ending(cls, last: date, *, days: int = 1) -> "Period":
        if days < 1:
            raise ValueError("a period has at least one day")
        return cls(first=last - timedelta(days=days - 1), last=last)

    @property
    def start(self) -> datetime:
        return datetime.combine(self.first, time.min, tzinfo=UTC)

    @property
    def end(self) -> datetime:
        """The first instant after the period."""
        return datetime.combine(self.last + timedelta(days=1), time.min, tzinfo=UTC)

    @property
    def days(self) -> int:
        return (self.last - self.first).days + 1

    @property
    def dates(self) -> list[date]:
        return [self.first + timedelta(days=i) for i in range(self.days)]

    def __str__(self) -> str:
        return str(self.last) if self.first == self.last else f"{self.first}..{self.last}"

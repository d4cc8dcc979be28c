"""Command-line argument types the management commands share: parsed strictly, refused with the expected form."""

from argparse import ArgumentTypeError
from datetime import date, datetime


def parse_day(value: str) -> date:
    """Parse a YYYY-MM-DD command-line argument, with an error that names the expected form."""
    try:
        return datetime.strptime(value, "%Y-%m-%d").date()
    except ValueError:
        raise ArgumentTypeError(f"{value!r} is not a date (YYYY-MM-DD)") from None

"""Command-line days: parsed strictly, refused with a message naming the expected form, by every command taking one."""

from argparse import ArgumentTypeError
from datetime import date

import pytest
from django.core.management import CommandError, call_command

from core.arguments import parse_day


def test_parse_day():
    assert parse_day("2026-11-20") == date(2026, 11, 20)
    for bad in ("2026-02-30", "20-11-2026", "yesterday", ""):
        with pytest.raises(ArgumentTypeError, match="YYYY-MM-DD"):
            parse_day(bad)


@pytest.mark.parametrize(
    "args",
    [
        ["run_nightly_reports", "--date", "2026-13-01"],
        ["seed_demo_data", "--orders", "1", "--days", "1", "--end", "2026-13-01"],
    ],
)
def test_commands_refuse_a_bad_day(args):
    with pytest.raises(CommandError, match="YYYY-MM-DD"):
        call_command(*args)

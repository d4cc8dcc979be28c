"""What a fault test tells of its run (the faults it injected, what clients were answered, how long recovery took),
shown at the end of the run whatever the test's outcome and however the run is split over workers.

A test's prints are captured, and a pytest-xdist worker's uncaptured output goes nowhere, so a figure printed past
the capture shows only in a run without workers. A test hands its account to the `summary` fixture instead (this
module is a pytest plugin, which conftest.py loads): it is kept with the test's report (user_properties, which travel
from a worker to the controller), and the run's terminal summary lists each with the test's outcome and the length
of its call.
"""

import functools

import pytest
from _pytest.nodes import Item
from _pytest.terminal import TerminalReporter

PROPERTY = "summary"


def record(item: Item, text: str) -> None:
    item.user_properties.append((PROPERTY, text.strip()))


@pytest.fixture
def summary(request):
    """A fault test's account of its run, shown at the run's end: `summary(text)`."""
    return functools.partial(record, request.node)


def pytest_terminal_summary(terminalreporter: TerminalReporter) -> None:
    """Write every summary the run's tests recorded, each under its test's id, outcome and call length."""
    entries = [
        (report, text)
        for outcome in ("passed", "failed")
        for report in terminalreporter.stats.get(outcome, [])
        if report.when == "call"
        for name, text in report.user_properties
        if name == PROPERTY
    ]
    if not entries:
        return
    terminalreporter.write_sep("=", "what the fault tests saw")
    for report, text in sorted(entries, key=lambda entry: entry[0].nodeid):
        terminalreporter.write_line(f"{report.nodeid} ({report.outcome}, {report.duration:.1f} s):")
        for line in text.splitlines():
            terminalreporter.write_line(f"  {line}")

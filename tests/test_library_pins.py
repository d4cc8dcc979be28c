"""docs/LIBRARY_INTERNALS.md against the code and the requirements: each of its rows has its test in
tests/test_library_internals.py and each test its row; each library is pinned in requirements/*.in to the range its
row gives; the installed version is the one its row says was tested, inside that range.
"""

import re
from importlib.metadata import version
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "LIBRARY_INTERNALS.md"
TESTS = ROOT / "tests" / "test_library_internals.py"


def doc_rows(text: str) -> dict[str, tuple[str, str, str]]:
    """Return each row's name -> (its package as requirements name it, the version tested, the range pinned)."""
    found = {}
    for line in text.splitlines():
        cells = [cell.strip().strip("`") for cell in line.strip().strip("|").split("|")]
        if len(cells) == 7 and re.fullmatch(r"[a-z][a-z0-9-]+", cells[0]) and cells[0] != "row":
            found[cells[0]] = (cells[1], cells[5], cells[6])
    return found


def in_requirements() -> dict[str, Requirement]:
    """Return each package named in requirements/*.in -> its requirement."""
    found = {}
    for path in sorted((ROOT / "requirements").glob("*.in")):
        for line in path.read_text().splitlines():
            if line.strip() and not line.startswith(("#", "-")):
                requirement = Requirement(line)
                found[requirement.name.lower()] = requirement
    return found


def test_the_table_is_read():
    text = "| row | package | a | b | c | tested | pinned |\n|---|---|---|---|---|---|---|\n"
    text += "| `amqp-x` | `amqp` | `_write` | `outbox/publisher.py` | why | 5.4.2 | `==5.4.2` |\n"
    assert doc_rows(text) == {"amqp-x": ("amqp", "5.4.2", "==5.4.2")}


def test_every_row_has_its_test_and_every_test_its_row():
    tested = set(re.findall(r'^@internal\("([a-z0-9-]+)"\)$', TESTS.read_text(), re.MULTILINE))
    assert set(doc_rows(DOC.read_text())) == tested


def test_each_library_is_pinned_to_the_range_tested_and_the_installed_version_is_the_one_tested():
    pins = in_requirements()
    for name, (package, tested, pinned) in doc_rows(DOC.read_text()).items():
        requirement = pins.get(package.lower())
        where = f"docs/LIBRARY_INTERNALS.md row `{name}`"
        assert requirement is not None, f"{package} ({where}) is in no requirements/*.in file"
        assert requirement.specifier == Requirement(f"{package}{pinned}").specifier, (
            f"requirements/*.in pins {requirement}; {where} says {pinned}"
        )
        assert requirement.specifier.contains(tested), f"{where}: {tested} lies outside {pinned}"
        assert version(package) == tested, (
            f"{package} {version(package)} is installed; {where} was tested on {tested}: "
            "run tests/test_library_internals.py on it, then update the row"
        )

"""The suite CI runs holds every test: each app's tests package is under pytest's testpaths (pyproject.toml).

pytest with no path collects only testpaths, so an app left out of it has tests that pass when run by hand and never
run in CI.
"""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_tests_package_is_collected_by_a_plain_pytest_run():
    testpaths = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["testpaths"]
    found = ROOT.glob("**/tests/__init__.py")
    packages = {path.parent.relative_to(ROOT) for path in found if ".venv" not in path.parts}

    uncollected = sorted(str(p) for p in packages if not any(p.is_relative_to(top) for top in testpaths))

    assert uncollected == []

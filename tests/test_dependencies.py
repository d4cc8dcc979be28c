"""Dependencies point one way: core <- accounts, outbox, credits <- orders <- analytics, and demo beside analytics;
config is wiring over them all.

Read from the source (every import statement, at module level or inside a function), so an import that points
back fails here before it makes a cycle. Tests and migrations are left out: they may reach anywhere.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ("core", "config", "accounts", "orders", "outbox", "credits", "analytics", "demo")

# Package -> the project packages it may import besides itself. outbox and credits are the two services' cores and
# know nothing of each other: what crosses between them is the message (core.contract).
ALLOWED = {
    "core": set(),
    "config": {"core"},
    "outbox": {"core"},
    "credits": {"core"},
    "accounts": {"core"},
    # The order service writes through the outbox, and its web read path asks the credits database for statuses.
    "orders": {"core", "outbox", "credits"},
    # The nightly job reads both services and repairs through the outbox.
    "analytics": {"core", "orders", "outbox", "credits"},
    # The demo tools write both services' tables directly (a consistent history, then faults planted in it); they
    # know the checks only by the contract's names, and nothing imports them but tests and benchmarks.
    "demo": {"core", "orders", "outbox", "credits"},
}
# The URLconf wires every app's views into one site.
WIRING = {"config/urls.py"}


def project_imports(path: Path) -> set[tuple[str, int]]:
    """Return (top-level project package, line) for each import of the project in a source file."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found |= {(name.split(".")[0], node.lineno) for name in names if name.split(".")[0] in PROJECT}
    return found


def sources(package: str) -> list[Path]:
    return [
        path
        for path in sorted((ROOT / package).rglob("*.py"))
        if not {"tests", "migrations"} & set(path.relative_to(ROOT).parts)
    ]


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_imports_point_one_way(package):
    wrong = []
    for path in sources(package):
        relative = path.relative_to(ROOT).as_posix()
        if relative in WIRING:
            continue
        for imported, line in sorted(project_imports(path)):
            if imported != package and imported not in ALLOWED[package]:
                wrong.append(f"{relative}:{line} imports {imported}")
    assert wrong == [], f"{package} may import only {sorted(ALLOWED[package]) or 'nothing of the project'}"


def test_the_check_sees_an_import_that_points_back(tmp_path):
    module = tmp_path / "relay.py"
    module.write_text("def f():\n    from orders.services import order_create\n\nimport core.contract\n")
    assert project_imports(module) == {("orders", 2), ("core", 4)}


def test_every_project_package_has_a_rule():
    packages = {path.parent.name for path in ROOT.glob("*/__init__.py")} - {"tests", "bench"}
    assert packages == set(ALLOWED)

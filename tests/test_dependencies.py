"""Dependencies point one way: core <- accounts, outbox, credits <- orders <- analytics, and demo beside analytics;
config is wiring over them all.

Read from the source (every import statement, at module level or inside a function), so an import that points
back fails here before it makes a cycle. Tests and migrations are left out: they may reach anywhere. Inside each
package the modules import one another without a circle, and tests and benchmarks share their process helpers
through testkit/: nothing imports a conftest.py or a test module, and bench/ imports nothing from tests/.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ("core", "config", "accounts", "orders", "outbox", "credits", "analytics", "demo", "testkit")

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
    # The process and cluster helpers of tests and benchmarks start and inspect the whole system; no app imports them.
    "testkit": {"core", "config", "accounts", "orders", "outbox", "credits", "analytics", "demo"},
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


def sources(package: str, root: Path = ROOT) -> list[Path]:
    return [
        path
        for path in sorted((root / package).rglob("*.py"))
        if not {"tests", "migrations"} & set(path.relative_to(root).parts)
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


# --- no circle inside a package -----------------------------------------------------------------------------------


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, name: str, known: set[str]) -> set[str]:
    """Return the modules among `known` that a source file imports, at module level or inside a function.

    `from package import name` imports package.name when that is a module, else the package's __init__.
    """
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found |= {f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names}
    return found & known


def import_graph(package: str, root: Path = ROOT) -> dict[str, set[str]]:
    """Return each module of the package (tests and migrations left out) -> the package's modules it imports."""
    names = {path: module_name(path, root) for path in sources(package, root)}
    known = set(names.values())
    return {name: imported_modules(path, name, known) - {name} for path, name in names.items()}


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Return the strongly connected components of more than one module (Tarjan): each holds an import circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for imported in sorted(graph.get(module, ())):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = set()
            while True:
                member = stack.pop()
                component.add(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(component)

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_no_import_circle_inside_a_package(package):
    found = circles(import_graph(package))
    assert found == [], f"modules of {package} import one another in a circle: {[sorted(c) for c in found]}"


def test_the_circle_check_sees_a_function_level_import_that_closes_a_circle(tmp_path):
    package = tmp_path / "shop"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from shop import b\n")
    (package / "b.py").write_text("import shop.c\n")
    (package / "c.py").write_text("def f():\n    from shop.a import g\n")
    (package / "d.py").write_text("from shop import a\n")
    (package / "e.py").write_text("from . import d\n")
    graph = import_graph("shop", tmp_path)
    assert graph["shop.e"] == {"shop.d"}
    assert circles(graph) == [{"shop.a", "shop.b", "shop.c"}]


# --- tests and benchmarks share helpers through testkit/ -----------------------------------------------------------


def is_test_module(name: str) -> bool:
    last = name.rpartition(".")[2]
    return last == "conftest" or last.startswith("test_")


def all_sources() -> list[Path]:
    skip = {".venv", "migrations", "node_modules"}
    return [path for path in sorted(ROOT.rglob("*.py")) if not skip & set(path.relative_to(ROOT).parts)]


def imported_names(path: Path) -> set[tuple[str, int]]:
    """Return (module, line) for each absolute import in a source file, `from x import y` as both x and x.y."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {(alias.name, node.lineno) for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found |= {(node.module, node.lineno)} | {(f"{node.module}.{a.name}", node.lineno) for a in node.names}
    return found


def test_nothing_imports_a_conftest_or_a_test_module():
    wrong = [
        f"{path.relative_to(ROOT).as_posix()}:{line} imports {name}"
        for path in all_sources()
        for name, line in sorted(imported_names(path))
        if is_test_module(name)
    ]
    assert wrong == [], "share helpers through testkit/ (or an app's tests/support.py), not a conftest or test module"


@pytest.mark.parametrize("package", ["bench", "testkit"])
def test_benchmarks_and_the_testkit_import_nothing_from_tests(package):
    wrong = [
        f"{path.relative_to(ROOT).as_posix()}:{line} imports {name}"
        for path in sorted((ROOT / package).rglob("*.py"))
        for name, line in sorted(imported_names(path))
        if "tests" in name.split(".")
    ]
    assert wrong == [], "move what is shared into testkit/"


def test_the_tests_import_check_sees_an_import_from_tests(tmp_path):
    module = tmp_path / "bench_x.py"
    module.write_text("def f():\n    from tests.reliability.conftest import purge_queues\n")
    names = {name for name, _ in imported_names(module)}
    assert "tests.reliability.conftest" in names
    assert any(is_test_module(name) for name in names)

"""deploy/systemd/: every unit passes `systemd-analyze verify`, runs what the tests run, and stops as documented.

systemd-analyze (Debian's `systemd` package, installed by scripts/setup.sh) verifies unit files offline, with no
systemd running. It checks that each ExecStart binary exists, so it verifies a copy of the units whose
/opt/creditshop/.venv/bin/ is this test run's virtualenv. It exits 0 on a setting it ignores (an unknown key, a value
it cannot parse), so any output at all fails the test. The stop settings each process needs are in one place, the
table in docs/OPERATIONS.md, "Stopping and restarting": each of its rows names the process's unit and its values.
"""

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from core.beat import GOODBYE_SECONDS
from testkit.harness import ROOT, VENV_BIN, Cluster

UNITS_DIR = ROOT / "deploy" / "systemd"
SERVICES = sorted(UNITS_DIR.glob("*.service"))
INSTALL_DIR = "/opt/creditshop"
STOP_KEYS = ("KillSignal", "KillMode", "TimeoutStopSec")
# Which process of testkit.harness.Cluster each unit runs.
HARNESS_NAMES = {
    "creditshop-web.service": "web",
    "creditshop-relay.service": "relay",
    "creditshop-outbox-worker.service": "outbox",
    "creditshop-credits-worker@.service": "credits",
    "creditshop-analytics-worker.service": "analytics",
    "creditshop-beat.service": "beat",
}
# Options a deployment sizes or names for itself (pool, concurrency, node name, log level, schedule file, address,
# workers, threads); the rest of a command line is what the process is, and must be what the tests run.
SIZING_OPTIONS = {"-P", "-c", "-n", "-l", "-s", "--bind", "--workers", "--threads"}


def unit_settings(path: Path) -> dict[tuple[str, str], list[str]]:
    """Return each (section, key) of a unit file with its values in order (a key may be given more than once)."""
    settings: dict[tuple[str, str], list[str]] = {}
    section = ""
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        settings.setdefault((section, key.strip()), []).append(value.strip())
    return settings


def setting(path: Path, section: str, key: str) -> str | None:
    values = unit_settings(path).get((section, key))
    return values[-1] if values else None


def stop_table() -> list[dict]:
    """Return the rows of OPERATIONS.md's stop table: process, the units its systemd cell names, and its settings."""
    text = (ROOT / "docs" / "OPERATIONS.md").read_text()
    section = text.split("\n## Stopping and restarting\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) != 5 or cells[0] in ("process", "---"):
            continue
        systemd = cells[4]
        rows.append(
            {
                "process": cells[0],
                "units": re.findall(r"`(creditshop-[\w@.-]+\.service)`", systemd),
                "settings": dict(re.findall(rf"`({'|'.join(STOP_KEYS)})=([^`\s]+)`", systemd)),
            }
        )
    return rows


def process_rows() -> list[dict]:
    """Return the table's rows for a supervised process (those giving stop settings; not a reload, not a command
    run by hand)."""
    return [row for row in stop_table() if row["settings"]]


def exec_start(path: Path) -> list[str]:
    """Return a unit's command line as systemd runs instance 1 of it: %i expanded, %% unescaped."""
    command = setting(path, "Service", "ExecStart").replace("%%", "\0").replace("%i", "1")
    assert "%" not in command, f"{path.name}: a systemd specifier other than %i in ExecStart: {command}"
    return shlex.split(command.replace("\0", "%"))


def role(command: list[str]) -> list[str]:
    """Return a command line without its sizing options and with the program's bare name."""
    program, *args = command
    kept = [Path(program).name]
    value_follows = False
    for arg in args:
        if value_follows:
            value_follows = False
            continue
        option, equals, _ = arg.partition("=")
        if option in SIZING_OPTIONS:
            value_follows = not equals
            continue
        kept.append(arg)
    return kept


def test_systemd_analyze_verify_accepts_every_unit(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.fail("systemd-analyze is not installed: run scripts/setup.sh (Debian package systemd)")
    units = [*SERVICES, *UNITS_DIR.glob("*.target")]
    for unit in units:
        text = unit.read_text().replace(f"{INSTALL_DIR}/.venv/bin/", f"{VENV_BIN}/")
        (tmp_path / unit.name).write_text(text.replace(f"WorkingDirectory={INSTALL_DIR}", f"WorkingDirectory={ROOT}"))

    done = subprocess.run(
        [analyze, "verify", "--man=no", *(unit.name for unit in units)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert (done.returncode, done.stdout + done.stderr) == (0, "")


def test_the_stop_table_names_a_unit_for_every_process():
    rows = process_rows()

    assert [row["process"] for row in rows if len(row["units"]) != 1] == []
    assert sorted(row["units"][0] for row in rows) == sorted(path.name for path in SERVICES)


@pytest.mark.parametrize("row", process_rows(), ids=lambda row: row["process"])
def test_each_unit_stops_as_the_stop_table_says(row):
    unit = UNITS_DIR / row["units"][0]

    assert set(row["settings"]) == set(STOP_KEYS), f"{row['process']}: the table gives {row['settings']}"
    assert {key: setting(unit, "Service", key) for key in STOP_KEYS} == row["settings"]


@pytest.mark.parametrize("unit", SERVICES, ids=lambda path: path.name)
def test_each_unit_is_restarted_forever_and_runs_as_the_service_user(unit):
    settings = unit_settings(unit)

    assert setting(unit, "Service", "Restart") == "always"
    assert setting(unit, "Service", "RestartSec")
    # 0 turns systemd's start rate limit off, so a unit that keeps failing is never given up on.
    assert setting(unit, "Unit", "StartLimitIntervalSec") == "0"
    assert setting(unit, "Service", "User") == setting(unit, "Service", "Group") == "creditshop"
    assert setting(unit, "Service", "WorkingDirectory") == INSTALL_DIR
    assert settings[("Service", "EnvironmentFile")][0] == "/etc/creditshop/creditshop.env"
    hardening = {key: setting(unit, "Service", key) for key in ("NoNewPrivileges", "ProtectSystem", "PrivateTmp")}
    assert hardening == {"NoNewPrivileges": "yes", "ProtectSystem": "full", "PrivateTmp": "yes"}
    assert setting(unit, "Unit", "PartOf") == setting(unit, "Install", "WantedBy") == "creditshop.target"


@pytest.mark.parametrize("unit", SERVICES, ids=lambda path: path.name)
def test_each_unit_runs_what_the_tests_run(unit):
    commands = Cluster(service_env={}, workdir=Path("/nonexistent")).commands()
    command = exec_start(unit)

    assert command[0].startswith(f"{INSTALL_DIR}/.venv/bin/")
    assert role(command) == role(commands[HARNESS_NAMES[unit.name]])


def test_beats_goodbye_to_a_silent_broker_ends_well_inside_its_stop_timeout():
    """The goodbye's deadline (core/beat.py) leaves beat at least as long again to exit before systemd kills it."""
    timeout = float(setting(UNITS_DIR / "creditshop-beat.service", "Service", "TimeoutStopSec"))

    assert timeout >= 2 * GOODBYE_SECONDS

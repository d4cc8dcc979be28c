"""deploy/prometheus/: the rules, the scrape config and the Alertmanager example are valid, and every alert is tested.

promtool (Debian's `prometheus` package, installed by scripts/setup.sh) checks the rule and config files and runs the
rules' unit tests; amtool (`prometheus-alertmanager`) checks the routing example. Here we also hold every alert to the
team's rules: a summary, a severity, and a runbook link to a section of docs/OPERATIONS.md that exists.
"""

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy" / "prometheus"
RULES = DEPLOY / "creditshop.rules.yml"
RULE_TESTS = sorted((DEPLOY / "tests").glob("*.yml"))
SEVERITIES = {"critical", "warning"}


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"{name} is not installed: run scripts/setup.sh (Debian packages prometheus, prometheus-alertmanager)"
        )
    return path


def run(*command: str) -> str:
    done = subprocess.run(command, cwd=DEPLOY, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def alerts() -> list[dict]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def github_anchors(markdown: str) -> set[str]:
    """Return the anchors GitHub gives the headings of a Markdown text."""
    anchors = set()
    for heading in re.findall(r"^#+ +(.+?) *$", markdown, flags=re.MULTILINE):
        anchors.add(re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-"))
    return anchors


def test_promtool_accepts_the_rules_and_the_scrape_config():
    promtool = tool("promtool")
    assert "SUCCESS" in run(promtool, "check", "rules", str(RULES))
    # Syntax only: the token file it names exists on the Prometheus host, not here.
    assert "SUCCESS" in run(promtool, "check", "config", "--syntax-only", str(DEPLOY / "prometheus.yml"))


def test_the_rules_unit_tests_pass():
    assert RULE_TESTS
    assert "SUCCESS" in run(tool("promtool"), "test", "rules", *map(str, RULE_TESTS))


def test_the_alertmanager_example_is_valid_and_routes_by_severity():
    amtool = tool("amtool")
    config = str(DEPLOY / "alertmanager.yml")
    assert "SUCCESS" in run(amtool, "check-config", config)
    for severity, receiver in (("critical", "creditshop-pager"), ("warning", "creditshop-tickets")):
        routed = run(amtool, "config", "routes", "test", f"--config.file={config}", f"severity={severity}")
        assert routed.splitlines()[0].strip() == receiver


def test_every_alert_has_a_summary_a_severity_and_a_runbook_that_exists():
    anchors = github_anchors((ROOT / "docs" / "OPERATIONS.md").read_text())
    problems = []
    for alert in alerts():
        name, annotations = alert["alert"], alert.get("annotations", {})
        if not annotations.get("summary"):
            problems.append(f"{name}: no summary")
        if alert.get("labels", {}).get("severity") not in SEVERITIES:
            problems.append(f"{name}: severity not one of {sorted(SEVERITIES)}")
        path, _, anchor = annotations.get("runbook_url", "").partition("#")
        if path != "docs/OPERATIONS.md" or anchor not in anchors:
            problems.append(f"{name}: runbook_url {annotations.get('runbook_url')!r} is no section of OPERATIONS.md")
    assert problems == []


def test_every_alert_is_seen_firing_in_the_unit_tests():
    fired = {
        case["alertname"]
        for path in RULE_TESTS
        for test in yaml.safe_load(path.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert {alert["alert"] for alert in alerts()} - fired == set()


def test_the_checks_see_a_broken_rule(tmp_path):
    """The harness is not vacuous: a rule file whose alert fires at a different time fails `promtool test rules`."""
    broken = tmp_path / "creditshop.rules.yml"
    broken.write_text(
        RULES.read_text().replace("creditshop:outbox_lag_seconds:max > 60", "creditshop:outbox_lag_seconds:max > 600")
    )
    (tmp_path / "tests").mkdir()
    for path in RULE_TESTS:
        (tmp_path / "tests" / path.name).write_text(path.read_text())
    done = subprocess.run(
        [tool("promtool"), "test", "rules", *(str(tmp_path / "tests" / p.name) for p in RULE_TESTS)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0 and "OutboxOldestDueRowOld" in done.stdout + done.stderr

"""deploy/prometheus/: the rules, the scrape config and the Alertmanager example are valid, and every alert is tested.

promtool (Debian's `prometheus` package, installed by scripts/setup.sh) checks the rule and config files and runs the
rules' unit tests; amtool (`prometheus-alertmanager`) checks the routing example. Here we also hold every alert to the
team's rules: a summary, a severity, and a runbook link to a section of docs/OPERATIONS.md that exists.

tests/reliability/test_prometheus.py runs OutboxRelayDown on a real Prometheus with the rules' durations scaled down
(testkit/prometheus_server.scaled_rules): the shipped durations themselves are held here, to ten seconds.
"""

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from testkit.prometheus_server import scaled_rules

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


RELAY_DOWN = {"severity": "critical", "job": "creditshop"}
RELAY_DOWN_ANNOTATIONS = {
    "summary": "Outbox rows are due but nothing was published for 2 minutes: the relay is down",
    "runbook_url": "docs/OPERATIONS.md#outboxrelaydown",
}


def relay_down_fires(*, before: str, at: str, waited: str) -> list[dict]:
    description = f"The oldest due row has waited {waited}. Orders are accepted; no credit message leaves."
    annotations = {**RELAY_DOWN_ANNOTATIONS, "description": description}
    return [
        {"eval_time": before, "alertname": "OutboxRelayDown", "exp_alerts": []},
        {
            "eval_time": at,
            "alertname": "OutboxRelayDown",
            "exp_alerts": [{"exp_labels": RELAY_DOWN, "exp_annotations": annotations}],
        },
    ]


# OutboxRelayDown's three durations, each the last one crossed in one case, sampled every 10 s and evaluated every
# 5 s (deploy/prometheus/tests evaluate every minute, which cannot tell `for: 1m` from `for: 30s`, nor the lag's 120 s
# from 60 s or 180 s). The checks fall between samples, so they hold whether a range includes its left edge or not.
RELAY_DOWN_TESTS = {
    "evaluation_interval": "5s",
    "tests": [
        # Rows long due; the last publish is at 5m: nothing published in [t-2m, t] from 6m50-6m55, then 1m of `for:`.
        {
            "interval": "10s",
            "input_series": [
                {"series": 'outbox_lag_seconds{job="creditshop", instance="web-1"}', "values": "600x60"},
                {"series": 'outbox_published_total{job="creditshop", instance="web-1"}', "values": "0+1x30 30x30"},
            ],
            "alert_rule_test": relay_down_fires(before="7m45s", at="7m55s", waited="10m 0s"),
        },
        # Nothing ever published; the oldest due row passes 120 s at 2m10, then 1m of `for:`.
        {
            "interval": "10s",
            "input_series": [{"series": 'outbox_lag_seconds{job="creditshop", instance="web-1"}', "values": "0+10x40"}],
            "alert_rule_test": relay_down_fires(before="3m5s", at="3m10s", waited="3m 10s"),
        },
    ],
}


def relay_down_test(tmp_path: Path, rules_text: str) -> subprocess.CompletedProcess:
    (tmp_path / "creditshop.rules.yml").write_text(rules_text)
    (tmp_path / "relay_down.test.yml").write_text(
        yaml.safe_dump({"rule_files": ["creditshop.rules.yml"], **RELAY_DOWN_TESTS})
    )
    return subprocess.run(
        [tool("promtool"), "test", "rules", "relay_down.test.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_outbox_relay_down_keeps_its_shipped_durations(tmp_path):
    done = relay_down_test(tmp_path, RULES.read_text())
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    "shipped, changed",
    [
        ("> 120", "> 110"),
        ("> 120", "> 130"),
        ("[2m]", "[110s]"),
        ("[2m]", "[130s]"),
        ("for: 1m", "for: 50s"),
        ("for: 1m", "for: 70s"),
    ],
)
def test_the_relay_down_checks_see_each_duration_ten_seconds_off(tmp_path, shipped, changed):
    text = RULES.read_text()
    start, end = text.index("alert: OutboxRelayDown"), text.index("alert: OutboxPublishFailing")
    assert shipped in text[start:end]
    done = relay_down_test(tmp_path, text[:start] + text[start:end].replace(shipped, changed) + text[end:])
    assert done.returncode != 0 and "OutboxRelayDown" in done.stdout + done.stderr


def numbers_out(expr: str) -> str:
    return re.sub(r"\d+(?:\.\d+)?(?:ms|[smhdwy])?", "N", expr)


def test_the_scaled_rules_are_the_shipped_ones_with_every_duration_scaled(tmp_path):
    shipped = yaml.safe_load(RULES.read_text())
    scaled = scaled_rules(RULES.read_text(), 0.1)
    (tmp_path / "scaled.rules.yml").write_text(yaml.safe_dump(scaled))
    assert "SUCCESS" in run(tool("promtool"), "check", "rules", str(tmp_path / "scaled.rules.yml"))
    pairs = [
        (ours, theirs)
        for our_group, their_group in zip(shipped["groups"], scaled["groups"], strict=True)
        for ours, theirs in zip(our_group["rules"], their_group["rules"], strict=True)
    ]
    # Only the numbers of expressions and `for:` change; names, labels and annotations are the shipped ones.
    for ours, theirs in pairs:
        assert {k: v for k, v in ours.items() if k not in ("expr", "for")} == {
            k: v for k, v in theirs.items() if k not in ("expr", "for")
        }
        assert numbers_out(ours["expr"]) == numbers_out(theirs["expr"])
        assert ("for" in ours) == ("for" in theirs)
    (relay_down,) = [theirs for _, theirs in pairs if theirs.get("alert") == "OutboxRelayDown"]
    assert relay_down["for"] == "6s"
    assert relay_down["expr"] == (
        "creditshop:outbox_lag_seconds:max > 12\n"
        "and on ()\n"
        "(sum(increase(outbox_published_total[12s])) or on () vector(0)) == 0\n"
    )

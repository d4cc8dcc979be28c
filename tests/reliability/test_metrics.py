"""/metrics from a real gunicorn in multiprocess mode carries every metric docs/OPERATIONS.md lists."""

import re

import pytest
import requests
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from analytics.models import NightlyRun
from credits.models import DeadLetter
from credits.services import dead_letter_record
from testkit.harness import ROOT
from testkit.processes import free_port

pytestmark = pytest.mark.slow


def documented_metrics() -> set[str]:
    # The "Metrics" table, up to the next section (the alerts table after it names alerts, not metrics).
    section = (ROOT / "docs" / "OPERATIONS.md").read_text().split("### Metrics", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `(\w+)` \|", section, flags=re.MULTILINE))


def test_every_documented_metric_is_scraped_from_gunicorn_in_multiprocess_mode(cluster):
    now = timezone.now()
    dead_letter_record(
        message_id="0" * 32,
        payload={"order_id": 1},
        reason=DeadLetter.Reason.MALFORMED,
        error="test",
        attempts=1,
        first_failed_at=now,
        last_failed_at=now,
    )
    # The nightly gauges appear once a run has finished.
    NightlyRun.objects.create(date=now.date(), status=NightlyRun.Status.SUCCEEDED, finished_at=now, ok=True)
    cluster.port = free_port()
    cluster.start("web")
    assert cluster.env()["PROMETHEUS_MULTIPROC_DIR"]

    response = requests.get(f"{cluster.base_url}/metrics", timeout=30)

    assert response.status_code == 200
    samples = {
        sample.name: sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }
    documented = documented_metrics()
    assert len(documented) >= 14
    # A histogram is documented by its name and scraped as _bucket, _count and _sum.
    assert {name for name in documented if name not in samples and f"{name}_count" not in samples} == set()
    assert samples["creditshop_credits_dead_letters_open"] == 1
    assert samples["creditshop_nightly_last_run_failed"] == 0

"""The staff report pages: staff only, list runs, serve each day's files and nothing else."""

from datetime import date

import pytest
from django.urls import reverse

from analytics.models import CheckResult, NightlyRun

pytestmark = pytest.mark.django_db

DAY = date(2026, 11, 20)


@pytest.fixture
def report(settings, tmp_path):
    settings.REPORTS_DIR = tmp_path
    directory = tmp_path / DAY.isoformat()
    directory.mkdir()
    (directory / "report.html").write_text("<h1>Nightly report</h1>")
    (directory / "consistency.json").write_text('{"date": "2026-11-20", "ok": true, "checks": {}}')
    return directory


def test_pages_are_for_staff_only(client, make_user, report):
    run = NightlyRun.objects.create(date=DAY)
    urls = [reverse("analytics:run-list"), reverse("analytics:run-detail", args=[run.pk]), f"/reports/{DAY}/"]
    for url in urls:
        assert client.get(url).status_code == 302  # to the admin login
    client.force_login(make_user("customer"))
    for url in urls:
        assert client.get(url).status_code == 302


def test_run_list_links_each_day_that_has_a_report(staff_client, report):
    NightlyRun.objects.create(date=DAY, days=2, status=NightlyRun.Status.SUCCEEDED, ok=False, violations=3)
    page = staff_client.get("/reports/")
    assert page.status_code == 200
    body = page.content.decode()
    assert f'href="/reports/{DAY}/"' in body
    assert 'href="/reports/2026-11-19/"' not in body  # covered, but no report file
    assert "<strong>3</strong>" in body


def test_run_detail_shows_what_each_check_found(staff_client):
    run = NightlyRun.objects.create(date=DAY, status=NightlyRun.Status.FAILED, stage="extract", error="boom")
    CheckResult.objects.create(run=run, date=DAY, name="missing_credit", count=2, sample=[7, 9])
    body = staff_client.get(f"/reports/runs/{run.pk}/").content.decode()
    assert "missing_credit" in body and "7, 9" in body and "boom" in body


def test_report_files_are_served_with_a_strict_policy(staff_client, report):
    page = staff_client.get(f"/reports/{DAY}/")
    assert page.status_code == 200
    assert page["Content-Type"].startswith("text/html")
    assert (
        "script-src" not in page["Content-Security-Policy"] and "default-src 'none'" in page["Content-Security-Policy"]
    )
    assert b"Nightly report" in b"".join(page.streaming_content)
    data = staff_client.get(f"/reports/{DAY}/consistency.json")
    assert data["Content-Type"] == "application/json"


@pytest.mark.parametrize(
    "url", ["/reports/2026-13-01/", "/reports/2026-11-21/", "/reports/2026-11-20/settings.py", "/reports/..%2F/"]
)
def test_unknown_days_and_files_are_404(staff_client, report, url):
    assert staff_client.get(url).status_code == 404

"""Every page a person uses, in chromium against gunicorn with production settings; a screenshot of each."""

from datetime import date, timedelta

import pytest
from django.utils import timezone
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import Select, WebDriverWait

from analytics import load
from analytics.checks import CheckContext
from analytics.models import CheckResult, NightlyRun
from analytics.period import Period
from analytics.results import CheckOutcome, DayResult
from credits.models import DeadLetter, OrderCredit
from credits.services import dead_letter_record
from credits.tests.support import place_order
from outbox.models import TransactionLog

pytestmark = pytest.mark.slow

DAY = date(2026, 11, 20)


def select_rows_and_act(browser, action: str, *row_ids) -> None:
    for row_id in row_ids:
        browser.click(f"input.action-select[value='{row_id}']")
    Select(browser.find("select[name=action]")).select_by_value(action)
    page = browser.find("html")
    browser.click("button[name=index]")
    # The action answers with a new page: wait until this one is gone, or the next find may read its messages.
    WebDriverWait(browser.driver, 15).until(expected_conditions.staleness_of(page))


def test_an_operator_finds_a_stuck_message_and_retries_it(browser, admin_user, user):
    order_id, payload = place_order(user=user)
    an_hour_ago = timezone.now() - timedelta(hours=1)
    TransactionLog.objects.filter(pk=payload["transaction_id"]).update(
        created_at=an_hour_ago, attempts=4, next_attempt_at=timezone.now() + timedelta(minutes=10), last_error="nacked"
    )

    browser.log_in("admin")
    browser.assert_styled()
    browser.screenshot("01-admin-index")
    browser.open("/admin/outbox/transactionlog/")
    browser.click("#changelist-filter a[href*='delivery=stuck']")
    assert payload["transaction_id"] in browser.find("#result_list").text
    browser.screenshot("02-outbox-stuck")
    select_rows_and_act(browser, "retry_now", payload["transaction_id"])

    assert "1" in browser.find("ul.messagelist li.success").text
    browser.screenshot("03-outbox-retried")
    row = TransactionLog.objects.get(pk=payload["transaction_id"])
    assert row.attempts == 0 and row.next_attempt_at <= timezone.now()
    assert browser.console_errors() == []


def test_an_operator_replays_a_dead_letter_and_the_order_is_credited_once(browser, admin_user, user):
    order_id, payload = place_order(user=user)
    now = timezone.now()
    dead_letter_record(
        message_id=payload["transaction_id"],
        payload=payload,
        reason=DeadLetter.Reason.DEADLOCK,
        error="OperationalError: (1213, 'Deadlock found when trying to get lock; try restarting transaction')",
        attempts=4,
        first_failed_at=now,
        last_failed_at=now,
    )
    letter = DeadLetter.objects.get(message_id=payload["transaction_id"])

    browser.log_in("admin")
    browser.open("/admin/credits/deadletter/")
    browser.assert_styled()
    browser.screenshot("04-dead-letters")
    select_rows_and_act(browser, "replay", letter.pk)
    assert "1 awarded" in browser.find("ul.messagelist li.success").text
    browser.screenshot("05-dead-letter-replayed")
    select_rows_and_act(browser, "replay", letter.pk)  # a second replay must not award again
    assert "1 no longer open" in browser.find("ul.messagelist li.success").text

    browser.open(f"/admin/credits/ordercredit/?q={order_id}")
    assert str(order_id) in browser.find("#result_list").text
    browser.screenshot("06-order-credited-once")
    assert OrderCredit.objects.filter(order_id=order_id).count() == 1
    assert browser.console_errors() == []


def day_result(day: date, *, violations: dict[str, int]) -> DayResult:
    """A day as the nightly job computes it, with figures of a plausible shop."""
    trend = [
        {"date": (day - timedelta(days=29 - i)).isoformat(), "orders": 900 + 7 * i, "credits_total": 5400 + 40 * i}
        for i in range(30)
    ]
    return DayResult(
        date=day,
        metrics={"orders": 1103, "credits_awarded": 1101, "credits_total": 6612, "users": 212, "new_users": 9},
        distribution={"users": 212, "p50": 24.0, "p90": 62.0, "p99": 120.0, "max": 188.0, "mean": 31.2},
        latency={"count": 1101, "p50": 0.4, "p95": 1.8, "p99": 6.5, "max": 31.0},
        credit_histogram=[{"lower": 2**i, "upper": 2 ** (i + 1), "users": 200 // (i + 1)} for i in range(8)],
        latency_histogram=[
            {"lower": lo, "upper": hi, "credits": n} for lo, hi, n in ((0, 1, 800), (1, 5, 250), (5, None, 51))
        ],
        top_users=[
            {
                "rank": i + 1,
                "user_id": 1000 + i,
                "orders": 30 - i,
                "credits_awarded": 30 - i,
                "credits_total": 190 - 9 * i,
            }
            for i in range(10)
        ],
        trend=trend,
        checks={
            name: CheckOutcome(count=count, sample=list(range(4100, 4100 + min(count, 5))))
            for name, count in violations.items()
        },
    )


CHECKS = (
    "order_without_log",
    "log_without_order",
    "missing_credit",
    "credit_amount_mismatch",
    "orphan_credit",
    "duplicate_credit",
    "stuck_outbox",
    "dead_letters_open",
)


@pytest.mark.parametrize("found", [{}, {"missing_credit": 3, "stuck_outbox": 1}], ids=["clean", "violations"])
def test_staff_open_a_nightly_run_and_its_report_with_every_chart(browser, admin_user, settings, live_web, found):
    settings.REPORTS_DIR = live_web.workdir / "reports"  # where the web process looks
    (settings.REPORTS_DIR / "parquet").mkdir(parents=True, exist_ok=True)  # the job's datasets, none here
    finished_at = timezone.now()
    run = NightlyRun.objects.create(
        date=DAY,
        status=NightlyRun.Status.SUCCEEDED,
        ok=not found,
        violations=sum(found.values()),
        orders=1103,
        credits=1101,
        # A run as the job records one: its start, end and duration agree on the page.
        started_at=finished_at - timedelta(seconds=41.7),
        finished_at=finished_at,
        duration_seconds=41.7,
        spark_master="local[*]",
    )
    for name in CHECKS:
        CheckResult.objects.create(run=run, date=DAY, name=name, count=found.get(name, 0), sample=[])
    day = day_result(DAY, violations={name: found.get(name, 0) for name in CHECKS})
    ctx = CheckContext(period=Period.ending(DAY), as_of=timezone.now(), grace_seconds=600)
    load.write_day_files(day, load.render_day_files(day, run=run, ctx=ctx))

    browser.log_in("admin")
    browser.open("/reports/")
    browser.assert_styled()
    name = "clean" if not found else "violations"
    browser.screenshot(f"07-reports-{name}")
    browser.click(f"a[href='/reports/runs/{run.pk}/']")
    browser.find("#content")
    browser.screenshot(f"08-run-{name}")
    browser.open(f"/reports/{DAY}/")
    images = browser.driver.find_elements("css selector", "img")

    assert len(images) == (5 if found else 4)  # a clean day says so in words, not with a chart of zeros
    assert browser.broken_images() == []
    assert browser.console_errors() == []  # a CSP violation would be reported here
    browser.screenshot(f"09-report-{name}")


def test_a_developer_tries_an_operation_on_the_api_docs_page(browser, admin_user, user):
    place_order(user=admin_user)

    browser.log_in("admin")  # Swagger UI then calls the API with the session
    browser.open("/api/docs/")
    browser.click("#operations-orders-orders_list .opblock-summary")
    browser.click("#operations-orders-orders_list .try-out__btn")
    browser.click("#operations-orders-orders_list .execute")
    status = browser.find("#operations-orders-orders_list .live-responses-table tbody .response-col_status")

    assert status.text.strip() == "200"
    assert '"count": 1' in browser.find("#operations-orders-orders_list .live-responses-table pre").text
    browser.screenshot("10-api-docs-try-it-out")
    assert browser.console_errors() == []


def test_the_redoc_page_loads_nothing_from_outside(browser):
    browser.open("/api/redoc/")
    browser.find("h1")  # ReDoc rendered the document's title
    browser.find("a[href='https://redocly.com/redoc/'] img")  # the footer whose logo came from Redocly's CDN

    resources = browser.driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert resources and [url for url in resources if not url.startswith(browser.base_url)] == []
    assert browser.broken_images() == []
    assert browser.console_errors() == []
    browser.screenshot("11-api-redoc")


def test_an_operator_reads_the_pipeline_page(browser, admin_user, user):
    order_id, payload = place_order(user=user)
    OrderCredit.objects.create(user_id=user.pk, order_id=order_id, amount=6, transaction_id=payload["transaction_id"])
    TransactionLog.objects.filter(pk=payload["transaction_id"]).update(
        status=TransactionLog.Status.PUBLISHED, published_at=timezone.now()
    )
    place_order(user=user)  # due, never published
    NightlyRun.objects.create(
        date=DAY, status=NightlyRun.Status.SUCCEEDED, finished_at=timezone.now(), ok=True, violations=0
    )

    browser.log_in("admin")
    browser.click("#operations-module a[href='/admin/pipeline/']")
    browser.assert_styled()

    assert browser.find("#orders-last-hour").text == "2"
    assert browser.find("#outbox-due").text == "1"
    assert browser.find("#latency-count").text == "1"
    assert "ok, no violations" in browser.find("#last-run").text
    assert len(browser.driver.find_elements("css selector", "svg.sparkline")) == 3
    assert browser.broken_images() == []
    assert browser.console_errors() == []  # a CSP violation would be reported here
    browser.screenshot("12-pipeline")

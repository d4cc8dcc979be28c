"""Staff pages: the history of nightly runs, and each day's HTML report and JSON files."""

from datetime import date

from django.contrib import admin
from django.contrib.admin.views.decorators import staff_member_required
from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render

from analytics import selectors
from analytics.models import NightlyRun
from analytics.pipeline import pipeline_read
from analytics.sparkline import bar_chart

REPORT_FILES = {
    "report.html": "text/html; charset=utf-8",
    "analytics.json": "application/json",
    "consistency.json": "application/json",
}
# The report is our own page with inline styles and images, and no scripts: allow exactly that.
REPORT_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"
# The pipeline page: the admin's own scripts and styles, inline SVG charts, and a refresh by <meta>, never by script.
PIPELINE_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
PIPELINE_REFRESH_SECONDS = 30


@staff_member_required
def run_list(request: HttpRequest) -> HttpResponse:
    """List the nightly runs, newest first, with a link to each day's report."""
    runs = list(selectors.run_list()[:200])
    for run in runs:
        run.report_dates = [
            d for d in selectors.run_dates(run=run) if (selectors.report_dir(d) / "report.html").exists()
        ]
    return render(
        request,
        "analytics/run_list.html",
        {**admin.site.each_context(request), "title": "Nightly reports", "runs": runs},
    )


@staff_member_required
def run_detail(request: HttpRequest, run_id: int) -> HttpResponse:
    """Show one run: its counts, its error if it failed, and what each check found per day."""
    run = get_object_or_404(NightlyRun, pk=run_id)
    results = selectors.run_check_results(run=run)
    return render(
        request,
        "analytics/run_detail.html",
        {**admin.site.each_context(request), "title": f"Nightly run #{run.pk}", "run": run, "results": results},
    )


@staff_member_required
def report_file(request: HttpRequest, day: str, name: str = "report.html") -> FileResponse:
    """Serve a day's report.html, analytics.json or consistency.json."""
    try:
        parsed = date.fromisoformat(day)
    except ValueError:
        raise Http404("no such day") from None
    if name not in REPORT_FILES:
        raise Http404("no such report file")
    path = selectors.report_dir(parsed) / name
    if not path.is_file():
        raise Http404(f"no {name} for {parsed}")
    response = FileResponse(path.open("rb"), content_type=REPORT_FILES[name])
    response["Content-Security-Policy"] = REPORT_CSP
    return response


@staff_member_required
def pipeline(request: HttpRequest) -> HttpResponse:
    """Show the pipeline's last hour: orders, outbox states, throughput, latency, dead letters, the last nightly run."""
    state = pipeline_read()
    charts = [
        bar_chart(state.orders_per_minute, title="orders"),
        bar_chart(state.published_per_minute, title="published"),
    ]
    credited = state.credits.credited_per_minute if state.credits is not None else []
    if state.credits is not None:
        charts.append(bar_chart(credited, title="credited"))
    response = render(
        request,
        "analytics/pipeline.html",
        {
            **admin.site.each_context(request),
            "title": "Pipeline",
            "state": state,
            "charts": charts,
            "published_total": sum(state.published_per_minute),
            "published_rate": sum(state.published_per_minute) / state.minutes.count,
            "credited_total": sum(credited),
            "credited_rate": sum(credited) / state.minutes.count,
            "refresh_seconds": PIPELINE_REFRESH_SECONDS,
        },
    )
    response["Content-Security-Policy"] = PIPELINE_CSP
    return response

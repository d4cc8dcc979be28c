"""Prometheus gauges of the nightly run, read from its history table when /metrics is scraped.

The run is a subprocess started once a night, so it keeps no counters of its own: what an alert needs (did the last
run fail, what did it find, when did one last succeed) is in analytics_nightly_runs, and any web process reads it.
"""

import logging

from prometheus_client.core import GaugeMetricFamily

logger = logging.getLogger(__name__)


class NightlyRunCollector:
    """Yield the last nightly run's verdict and the time of the last success, once any run has finished."""

    def describe(self):
        return []

    def collect(self):
        from analytics.selectors import run_last_finished, run_last_succeeded

        try:
            finished, succeeded = run_last_finished(), run_last_succeeded()
        except Exception as exc:  # a scrape must still answer when the database does not
            logger.warning("cannot read the nightly run history: %s", exc)
            return
        if finished is None:
            return  # a new installation: nothing to judge yet
        yield GaugeMetricFamily(
            "creditshop_nightly_last_run_failed",
            "1 when the newest finished nightly run failed (the job itself, not its checks), else 0.",
            value=float(finished.status == finished.Status.FAILED),
        )
        yield GaugeMetricFamily(
            "creditshop_nightly_last_success_timestamp_seconds",
            "Unix time the newest successful nightly run finished; 0 when none has succeeded yet.",
            value=succeeded.finished_at.timestamp() if succeeded and succeeded.finished_at else 0.0,
        )
        if succeeded is not None:
            yield GaugeMetricFamily(
                "creditshop_nightly_violations",
                "Consistency violations the newest successful nightly run found (0: the books balance).",
                value=float(succeeded.violations),
            )

"""Prometheus metrics of the credits consumer (served by /metrics, core/metrics.py).

The counters live in the process that counts: a Celery worker's, or (with PROMETHEUS_MULTIPROC_DIR set, and the
/metrics view reading it) the files shared by all processes on the host. The open dead-letter gauge is read from
the database at scrape time, and the version queues' gauges from the broker, so any web process reports the same
figures; /metrics adds them to the registry it builds per scrape, because the multiprocess collector reads only the
files, never the default registry.
"""

import logging

from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

logger = logging.getLogger(__name__)

AWARDS = Counter(
    "creditshop_credits_messages",
    "Credits messages applied by the consumer, by outcome (awarded, duplicate).",
    ["outcome"],
)
# Each outcome's series, bound once: labels() takes a lock and validates its arguments on every call.
AWARDS_AWARDED = AWARDS.labels(outcome="awarded")
AWARDS_DUPLICATE = AWARDS.labels(outcome="duplicate")
RETRIES = Counter(
    "creditshop_credits_retries",
    "Credits messages scheduled for another try after a transient failure, by reason.",
    ["reason"],
)
DEAD_LETTERED = Counter(
    "creditshop_credits_dead_lettered",
    "Credits messages dead-lettered (sent to credits.dead and recorded for the admin), by reason.",
    ["reason"],
)
OUTAGE_REQUEUES = Counter(
    "creditshop_credits_outage_requeues",
    "Credits messages put back on the queue, retries untouched, because the credits database could not be reached.",
)
VERSION_FORWARDS = Counter(
    "creditshop_credits_version_forwards",
    "Credits messages of a version this consumer does not accept found on `credits` (from a relay or consumer of the"
    " release before routing by version) and forwarded to their version's queue.",
)
# Order commit to credit, as the consumer sees it: from the outbox row's creation time (the relay's message header) to
# the award's commit. Spans the relay's wake-up or poll, the broker, any retries and the award itself.
ORDER_TO_CREDIT = Histogram(
    "creditshop_order_to_credit_seconds",
    "Seconds from an order's commit (its outbox row) to its credit's commit, measured by the credits consumer.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0),
)

OPEN_DEAD_LETTERS = "creditshop_credits_dead_letters_open"
OPEN_DEAD_LETTERS_HELP = "Dead-lettered credits messages waiting for an operator to replay or discard them."


class OpenDeadLettersCollector:
    """Report the number of open dead letters, counted in the database when scraped."""

    def describe(self):
        # Having describe() keeps registration from calling collect(), which would query at import time.
        return [GaugeMetricFamily(OPEN_DEAD_LETTERS, OPEN_DEAD_LETTERS_HELP)]

    def collect(self):
        from credits.selectors import dead_letters_open_count

        try:
            count = dead_letters_open_count()
        except Exception as exc:  # a scrape must still answer when the database does not
            logger.warning("cannot count open credit dead letters: %s", exc)
            return
        yield GaugeMetricFamily(OPEN_DEAD_LETTERS, OPEN_DEAD_LETTERS_HELP, value=count)


VERSION_WAITING = "creditshop_credits_version_messages_waiting"
VERSION_WAITING_HELP = (
    "Credits messages in a message version's queue not yet delivered to a consumer; with no consumer of the version"
    " they wait there, up to CREDITS_UNKNOWN_VERSION_WAIT_SECONDS."
)
VERSION_CONSUMERS = "creditshop_credits_version_consumers"
VERSION_CONSUMERS_HELP = "Consumers taking a message version's queue: 0 means no running consumer accepts the version."


class VersionQueuesCollector:
    """Report, per message version, the messages waiting in its queue and its consumers, read from the broker."""

    def describe(self):
        return [
            GaugeMetricFamily(VERSION_WAITING, VERSION_WAITING_HELP, labels=["version", "queue"]),
            GaugeMetricFamily(VERSION_CONSUMERS, VERSION_CONSUMERS_HELP, labels=["version", "queue"]),
        ]

    def collect(self):
        from credits.selectors import version_queues

        try:
            queues = version_queues()
        except Exception as exc:  # a scrape must still answer when the broker does not
            logger.warning("cannot read the credits version queues: %s", exc)
            return
        waiting = GaugeMetricFamily(VERSION_WAITING, VERSION_WAITING_HELP, labels=["version", "queue"])
        consumers = GaugeMetricFamily(VERSION_CONSUMERS, VERSION_CONSUMERS_HELP, labels=["version", "queue"])
        for queue in queues:
            labels = [str(queue.version), queue.queue]
            waiting.add_metric(labels, queue.messages)
            consumers.add_metric(labels, queue.consumers)
        yield waiting
        yield consumers


def counters_initialize() -> None:
    """Create every label value at zero, so each series exists from the first scrape and rate() sees its start."""
    from credits.models import DeadLetter

    # AWARDS's two series exist from import on (AWARDS_AWARDED, AWARDS_DUPLICATE).
    for reason in DeadLetter.Reason.values:
        RETRIES.labels(reason=reason)
        DEAD_LETTERED.labels(reason=reason)

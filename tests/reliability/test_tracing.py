"""One trace from POST /api/orders/ to the order_credits insert, across real gunicorn, relay and credits worker.

The processes export over OTLP/HTTP (protobuf) to a collector served by this test, as they would to Jaeger or Tempo.
Three orders: one awarded at once, one whose first insert is refused (a retry), one refused until it is
dead-lettered and then replayed from the admin.
"""

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests
from django.contrib.auth import get_user_model
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from accounts.services import api_token_create
from credits.models import DeadLetter, OrderCredit
from credits.services import credit_balance_ensure
from credits.tests.support import DatabaseFaults
from outbox.models import TransactionLog
from testkit.processes import free_port
from testkit.waiting import wait_for

pytestmark = pytest.mark.slow

SERVER, PRODUCER, CONSUMER = 2, 4, 5  # OTLP SpanKind values


class Collector:
    """A minimal OTLP/HTTP trace receiver keeping every span it is sent, flattened to a dict."""

    def __init__(self):
        self.spans: list[dict] = []
        self._lock = threading.Lock()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                request = ExportTraceServiceRequest()
                request.ParseFromString(self.rfile.read(int(self.headers["Content-Length"])))
                collector._add(request)
                body = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def _add(self, request: ExportTraceServiceRequest) -> None:
        with self._lock:
            for resource_spans in request.resource_spans:
                resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        self.spans.append(
                            {
                                "service": resource.get("service.name"),
                                "name": span.name,
                                "kind": span.kind,
                                "trace_id": span.trace_id.hex(),
                                "span_id": span.span_id.hex(),
                                "parent_id": span.parent_span_id.hex(),
                                "attributes": {a.key: a.value.string_value for a in span.attributes},
                                "links": [(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
                                "error": span.status.code == span.status.STATUS_CODE_ERROR,
                            }
                        )

    def snapshot(self) -> list[dict]:
        with self._lock:
            return list(self.spans)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def ancestors(span: dict, by_id: dict[str, dict]) -> Iterator[dict]:
    """Yield the span's parent, its parent, and so on, as far as the collector has them."""
    while span["parent_id"] in by_id:
        span = by_id[span["parent_id"]]
        yield span


def admin_replay(base_url: str, *, username: str, password: str, dead_letter_id: int) -> None:
    """Log in to the admin and run the replay action on one dead letter, as an operator would."""
    session = requests.Session()
    session.get(f"{base_url}/admin/login/", timeout=30)
    response = session.post(
        f"{base_url}/admin/login/?next=/admin/",
        data={
            "username": username,
            "password": password,
            "csrfmiddlewaretoken": session.cookies["csrftoken"],
            "next": "/admin/",
        },
        timeout=30,
    )
    assert response.ok and "sessionid" in session.cookies, response.text[-500:]
    response = session.post(
        f"{base_url}/admin/credits/deadletter/",
        data={
            "action": "replay",
            "_selected_action": str(dead_letter_id),
            "index": "0",
            "csrfmiddlewaretoken": session.cookies["csrftoken"],
        },
        timeout=30,
    )
    assert response.ok, response.text[-500:]


@pytest.fixture
def collector():
    collector = Collector()
    yield collector
    collector.close()


def test_one_trace_from_order_request_to_credit_through_retry_and_replay(cluster, collector):
    cluster.port = free_port()
    cluster.extra_env.update(
        OTEL_EXPORTER_OTLP_ENDPOINT=collector.endpoint,
        OTEL_TRACES_SAMPLER="always_on",
        OTEL_BSP_SCHEDULE_DELAY="100",
        LOG_FORMAT="json",
        CREDITS_MAX_RETRIES="1",
        CREDITS_RETRY_BASE_SECONDS="0.05",
        CREDITS_RETRY_MAX_SECONDS="0.1",
    )
    user = get_user_model().objects.create_user("buyer")
    token = api_token_create(user=user)[1]
    # The buyer's balance row exists, as after any first award: each award is then one batch, one SQL span (a
    # user's first award runs a second batch once its row is made: credits/tests/test_services.py).
    credit_balance_ensure(user_id=user.pk)
    get_user_model().objects.create_superuser("operator", password="operator-password-1")
    faults = DatabaseFaults()
    faults.install()
    try:
        cluster.start("web", "credits")
        orders = []
        for total in (1, 2, 3):
            response = requests.post(
                f"{cluster.base_url}/api/orders/",
                json={"goods_name": "widget", "total": total},
                headers={"Authorization": f"Token {token}"},
                timeout=30,
            )
            assert response.status_code == 201, response.text
            orders.append(response.json())
        awarded, retried, dead = orders
        faults.set(retried["id"], refuse=1)
        faults.set(dead["id"], refuse=100)
        cluster.start("relay")

        wait_for(
            lambda: OrderCredit.objects.filter(order_id__in=[awarded["id"], retried["id"]]).count() == 2,
            timeout=120,
            what="the first two credits",
        )
        letter = wait_for(
            lambda: DeadLetter.objects.filter(order_id=dead["id"], status=DeadLetter.Status.OPEN).first(),
            timeout=120,
            what="the third order's dead letter",
        )
        faults.clear(dead["id"])
        admin_replay(cluster.base_url, username="operator", password="operator-password-1", dead_letter_id=letter.pk)
        wait_for(lambda: OrderCredit.objects.filter(order_id=dead["id"]).exists(), timeout=60, what="the replay")
    finally:
        faults.remove()

    rows = {row.id: row for row in TransactionLog.objects.filter(id__in=[o["transaction_id"] for o in orders])}
    # The order request's context went into its transaction_log row: "00-<trace id>-<span id>-01".
    origin = {o["id"]: rows[o["transaction_id"]].traceparent.split("-")[1:3] for o in orders}
    assert all(len(trace_id) == 32 for trace_id, _ in origin.values()), origin

    # The award's statements go as one batch (START TRANSACTION; UPDATE ...; INSERT INTO order_credits ...; COMMIT).
    credit_insert = "INSERT INTO `order_credits`"

    def complete(spans: list[dict]) -> bool:
        inserts = [s for s in spans if credit_insert in s["attributes"].get("db.statement", "")]
        return len(inserts) >= 3 and any(s["name"] == "credits.dead_letter.replay" for s in spans)

    spans = wait_for(lambda: complete(collector.snapshot()) and collector.snapshot(), timeout=60, what="the spans")
    by_id = {s["span_id"]: s for s in spans}
    inserts = [s for s in spans if credit_insert in s["attributes"].get("db.statement", "")]

    for order in (awarded, retried):
        trace_id, request_span_id = origin[order["id"]]
        request = by_id[request_span_id]
        assert (request["service"], request["kind"], request["trace_id"]) == ("creditshop-web", SERVER, trace_id)
        assert "orders" in request["name"] and request["name"].startswith("POST"), request["name"]
        # Exactly one credit insert in the order's trace that succeeded (the retried order's refused one is there
        # too, marked as an error; the workers' batches may arrive in either order), with the award span as parent,
        # and the chain of parents leading back to the order request.
        succeeded = [s for s in inserts if s["trace_id"] == trace_id and not s["error"]]
        assert len(succeeded) == 1, f"{len(succeeded)} successful order_credits inserts in order {order['id']}'s trace"
        chain = list(ancestors(succeeded[0], by_id))
        names = [s["name"] for s in chain]
        assert names[0] == "credits.award" and chain[0]["service"] == "creditshop-worker", names
        assert chain[1]["kind"] == CONSUMER and "credits.award_credits" in chain[1]["name"], names
        assert chain[-1]["span_id"] == request_span_id, names
        # The relay published the message in a batch span of its own trace, linked to the order's.
        publishes = [s for s in spans if s["service"] == "creditshop-relay" and s["kind"] == PRODUCER]
        linking = [s for s in publishes if (trace_id, request_span_id) in s["links"]]
        assert linking and all(s["trace_id"] != trace_id for s in linking)
        if order is retried:
            assert "credits.retry" in names, names
            assert sum(1 for s in chain if s["kind"] == CONSUMER) == 2, names
        else:
            assert chain[1]["parent_id"] == request_span_id, names

    # The dead-lettered order: its failed attempts and the dead-letter record are in its own trace; the admin's
    # replay (which awarded it, see above) is a span of the admin request's trace, linked to the order's trace at
    # the span that recorded the dead letter (the dead letter keeps that context: the web reads nothing of the
    # outbox for it). The web traces no SQL statements, so the replay span is the award's.
    trace_id, request_span_id = origin[dead["id"]]
    recorded = [s for s in spans if s["name"] == "credits.dead_letter" and s["trace_id"] == trace_id]
    assert recorded and request_span_id in [s["span_id"] for s in ancestors(recorded[0], by_id)]
    replay = next(s for s in spans if s["name"] == "credits.dead_letter.replay")
    assert (trace_id, recorded[-1]["span_id"]) in replay["links"] and replay["trace_id"] != trace_id
    admin_request = by_id[replay["parent_id"]]
    assert admin_request["kind"] == SERVER and admin_request["name"].startswith("POST"), admin_request["name"]

    # Metrics: the consumer measured order-to-credit for both messages it awarded (the retried one included).
    metrics = requests.get(f"{cluster.base_url}/metrics", timeout=30).text
    count = re.search(r"^creditshop_order_to_credit_seconds_count(?:\{[^}]*\})? (\S+)$", metrics, re.M)
    assert count and float(count.group(1)) == 2, metrics[-2000:]

    # Logs: the worker's records are JSON carrying the trace, span and transaction they belong to.
    records = [json.loads(line) for line in cluster.logs("credits", tail=10_000).splitlines() if line.startswith("{")]
    retry_records = [
        r for r in records if r.get("transaction_id") == retried["transaction_id"] and "retry" in r["message"]
    ]
    assert retry_records and retry_records[0]["trace_id"] == origin[retried["id"]][0] and retry_records[0]["span_id"]
    dead_records = [r for r in records if r.get("transaction_id") == dead["transaction_id"] and r["level"] == "ERROR"]
    assert dead_records and dead_records[0]["trace_id"] == origin[dead["id"]][0]

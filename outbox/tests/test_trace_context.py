"""The outbox side of tracing: what a row keeps of its writer's trace, and what the relay puts in the headers."""

import pytest

from core.contract import CREATED_AT_HEADER
from outbox.claims import claim_due
from outbox.drain import relay_batch
from outbox.models import TransactionLog
from outbox.publisher import Publisher
from outbox.services import message_create

pytestmark = pytest.mark.django_db(transaction=True)

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.mark.django_db
def test_a_row_written_without_tracing_keeps_an_empty_trace_context():
    message = message_create(transaction_id="a" * 32, business="order", foreign_key="1", payload={"order_id": 1})

    row = TransactionLog.objects.get(pk=message.id)
    assert (row.traceparent, row.tracestate) == ("", "") == (message.traceparent, message.tracestate)


def test_the_relay_sends_each_rows_trace_context_and_creation_time_as_headers(make_rows, credits_queue):
    traced = make_rows(1, traceparent=TRACEPARENT, tracestate="vendor=1")[0]
    untraced = make_rows(1)[0]
    created = {row.id: row.created_at for row in TransactionLog.objects.filter(id__in=[traced, untraced])}
    publisher = Publisher()
    try:
        assert relay_batch(publisher, batch_size=10).published == 2
    finally:
        publisher.close()

    headers = {m.properties["message_id"]: m.properties["application_headers"] for m in credits_queue.get_all()}
    assert headers[traced]["traceparent"] == TRACEPARENT
    assert headers[traced]["tracestate"] == "vendor=1"
    assert "traceparent" not in headers[untraced] and "tracestate" not in headers[untraced]
    for tx in (traced, untraced):
        assert headers[tx][CREATED_AT_HEADER] == pytest.approx(created[tx].timestamp(), abs=1e-3)


def test_claim_reads_the_trace_context_back(make_rows):
    tx = make_rows(1, traceparent=TRACEPARENT)[0]

    (message,) = claim_due(limit=5).messages

    assert (message.id, message.traceparent, message.tracestate) == (tx, TRACEPARENT, "")

"""Publish award messages to the credits queue with the relay's own Publisher, from the checkout in the working dir.

Run by bench_credits.py with the working directory set to the checkout under test (this one or --baseline-dir), so
each side's workers drain the messages its own relay would send: a change to the message (its headers) is part of
the before/after comparison. Reads one JSON object per line on stdin: {"payload": ..., "created_at": unix seconds,
"traceparent": ...}; exits 1 unless every message is confirmed by the broker.
"""

import json
import os
import sys
from datetime import UTC, datetime

sys.path.insert(0, os.getcwd())
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

import django  # noqa: E402

django.setup()

from outbox.claims import ClaimedMessage  # noqa: E402
from outbox.publisher import Publisher  # noqa: E402

# The relay's batch size order of magnitude: one confirm wait per batch.
BATCH = 500


def main() -> int:
    messages = []
    for line in sys.stdin:
        item = json.loads(line)
        messages.append(
            ClaimedMessage(
                id=item["payload"]["transaction_id"],
                payload=item["payload"],
                attempts=0,
                created_at=datetime.fromtimestamp(item["created_at"], UTC),
                traceparent=item["traceparent"],
            )
        )
    publisher = Publisher()
    try:
        for start in range(0, len(messages), BATCH):
            result = publisher.publish(messages[start : start + BATCH])
            if result.failed or result.broker_error or len(result.confirmed) != len(messages[start : start + BATCH]):
                print(f"publish failed: {result.broker_error!r} {list(result.failed.items())[:3]}", file=sys.stderr)
                return 1
    finally:
        publisher.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

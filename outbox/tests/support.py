"""Helpers the outbox tests share: where the project is, the interpreter to start children with, a message payload."""

import sys
from pathlib import Path

from django.conf import settings

BASE_DIR = Path(settings.BASE_DIR)
PYTHON = sys.executable


def make_payload(transaction_id: str, order_id: int) -> dict:
    return {"schema_version": 1, "transaction_id": transaction_id, "order_id": order_id, "user_id": 7, "total": 3}

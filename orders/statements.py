"""The order request's plain SQL, built from the models: the order, its outbox row and its idempotency record.

Why plain SQL: the order request is the API's hot path, and the ORM spent more CPU building and compiling its three
inserts than the database spent running them (``core/sql.py`` says why, and how a statement is built from its
model's metadata). The order, its outbox row and its idempotency record go to MariaDB as one multi-statement batch,
one network round trip (``order_batch``); the rows after the order take its new key from a session variable the batch
sets: the outbox row's foreign key and its payload's order_id, the idempotency record's order.
tests/test_hot_path_sql.py checks every statement here against its model, and orders/tests/test_services.py reads the
rows back through the ORM.
"""

import functools

from core import sql
from orders.models import IdempotencyKey, Order
from outbox.models import TransactionLog
from outbox.services import MESSAGE_INSERT

ORDER_ID = "@creditshop_order_id"
ORDER_INSERT = sql.Insert(Order, ("user", "goods_name", "total", "transaction_id", "created_at"))
MESSAGE_AFTER_ORDER = sql.Insert(
    TransactionLog,
    MESSAGE_INSERT.fields,
    expressions={"foreign_key": f"CAST({ORDER_ID} AS CHAR)", "payload": f"JSON_SET(%s, '$.order_id', {ORDER_ID})"},
)
IDEMPOTENCY_KEY_INSERT = sql.Insert(
    IdempotencyKey, ("user", "key", "fingerprint", "order", "created_at"), expressions={"order": ORDER_ID}
)
# The payload's order_id until the database sets the order's new key there (JSON_SET above).
PENDING_ORDER_ID = 0


@functools.cache
def order_batch(*, idempotency_key: bool) -> sql.Transaction:
    """Return the order's transaction as one batch (core/sql.Transaction): the order, its outbox row and, for a
    request that sent an Idempotency-Key, its idempotency record, between START TRANSACTION and COMMIT."""
    statements = [ORDER_INSERT.sql, f"SET {ORDER_ID} = LAST_INSERT_ID()", MESSAGE_AFTER_ORDER.sql]
    if idempotency_key:
        statements.append(IDEMPOTENCY_KEY_INSERT.sql)
    return sql.Transaction(tuple(statements), begins=True, commits=True)

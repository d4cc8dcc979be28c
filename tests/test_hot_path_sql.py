"""The hot paths' plain SQL (core/sql.py) against the models: a model that gains a column fails here first."""

import pytest
from django.db import connections, models
from django.test.utils import isolate_apps
from django.utils import timezone

from core import sql
from credits.services import BALANCE_ADD, BALANCE_CREATE, CREDIT_INSERT, award_batch
from orders.models import Order
from orders.statements import IDEMPOTENCY_KEY_INSERT, MESSAGE_AFTER_ORDER, ORDER_INSERT, order_batch
from outbox import statements
from outbox.models import TransactionLog
from outbox.services import MESSAGE_INSERT

INSERTS = {
    "order": ORDER_INSERT,
    "idempotency key": IDEMPOTENCY_KEY_INSERT,
    "outbox message": MESSAGE_INSERT,
    "outbox message after its order": MESSAGE_AFTER_ORDER,
    "credit balance": BALANCE_CREATE,
    "order credit": CREDIT_INSERT,
}


def columns_left_to_no_default(insert: sql.Insert) -> list[str]:
    """Return the model's columns the INSERT neither writes nor leaves to a value the database gives by itself."""
    meta = insert.model._meta
    return [
        field.column
        for field in meta.concrete_fields
        if field.column not in insert.columns
        and not field.has_db_default()
        and not (field.null and not field.has_default())
        and field is not meta.auto_field
    ]


@pytest.mark.parametrize("insert", INSERTS.values(), ids=INSERTS.keys())
def test_every_column_of_the_model_is_written_or_left_to_a_database_default(insert):
    assert columns_left_to_no_default(insert) == []
    assert insert.sql  # builds, which checks the same from the other side


@pytest.mark.parametrize("insert", INSERTS.values(), ids=INSERTS.keys())
def test_a_column_left_to_the_database_defaults_to_what_the_orm_would_write(insert):
    for field in insert.model._meta.concrete_fields:
        if field.column in insert.columns or not field.has_db_default():
            continue
        assert field.has_default(), f"{field}: an ORM insert would write no value the database default matches"
        assert field.get_default() == getattr(field.db_default, "value", field.db_default), field


def test_the_statements_name_the_models_tables_and_columns_quoted():
    assert ORDER_INSERT.sql == (
        "INSERT INTO `orders` (`user_id`, `goods_name`, `total`, `transaction_id`, `created_at`)"
        " VALUES (%s, %s, %s, %s, %s)"
    )
    assert IDEMPOTENCY_KEY_INSERT.sql == (
        "INSERT INTO `idempotency_keys` (`user_id`, `key`, `fingerprint`, `order_id`, `created_at`)"
        " VALUES (%s, %s, %s, @creditshop_order_id, %s)"
    )
    assert MESSAGE_INSERT.sql == (
        "INSERT INTO `transaction_log` (`id`, `business`, `foreign_key`, `payload`, `status`, `next_attempt_at`,"
        " `created_at`, `traceparent`, `tracestate`) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
    )
    assert BALANCE_CREATE.sql == (
        "INSERT INTO `credit_balances` (`user_id`, `balance`, `updated_at`) VALUES (%s, %s, %s)"
        " ON DUPLICATE KEY UPDATE `user_id` = `user_id`"
    )
    assert BALANCE_ADD.sql == (
        "UPDATE `credit_balances` SET `balance` = `balance` + %s, `updated_at` = %s WHERE `user_id` = %s"
    )
    assert CREDIT_INSERT.sql == (
        "INSERT INTO `order_credits` (`order_id`, `user_id`, `total`, `transaction_id`, `created_at`, `ordered_at`)"
        " SELECT %s, %s, %s, %s, %s, %s FROM DUAL WHERE ROW_COUNT() = 1"
    )


def test_the_order_is_one_batch_of_the_models_statements():
    assert MESSAGE_AFTER_ORDER.columns == MESSAGE_INSERT.columns
    assert MESSAGE_AFTER_ORDER.sql == (
        "INSERT INTO `transaction_log` (`id`, `business`, `foreign_key`, `payload`, `status`, `next_attempt_at`,"
        " `created_at`, `traceparent`, `tracestate`) VALUES (%s, %s, CAST(@creditshop_order_id AS CHAR),"
        " JSON_SET(%s, '$.order_id', @creditshop_order_id), %s, %s, %s, %s, %s)"
    )
    statements = [ORDER_INSERT.sql, "SET @creditshop_order_id = LAST_INSERT_ID()", MESSAGE_AFTER_ORDER.sql]
    assert order_batch(idempotency_key=False).sql == "START TRANSACTION;\n" + ";\n".join([*statements, "COMMIT"])
    assert order_batch(idempotency_key=True).sql == "START TRANSACTION;\n" + ";\n".join(
        [*statements, IDEMPOTENCY_KEY_INSERT.sql, "COMMIT"]
    )


def test_an_expression_takes_its_fields_parameter_or_none():
    insert = sql.Insert(Order, ORDER_INSERT.fields, expressions={"user": "@u", "total": "ABS(%s)"})
    assert insert.sql == (
        "INSERT INTO `orders` (`user_id`, `goods_name`, `total`, `transaction_id`, `created_at`)"
        " VALUES (@u, %s, ABS(%s), %s, %s)"
    )
    assert insert.parameters([1, "mug", -3, "t", "now"]) == ["mug", -3, "t", "now"]
    assert ORDER_INSERT.parameters([1, "a", 2, "t", "now"]) == [1, "a", 2, "t", "now"]
    with pytest.raises(ValueError, match="one row"):
        insert.literal_rows([(1, "mug", 3, "t", "now")])
    with pytest.raises(ValueError, match="does not write"):
        sql.Insert(Order, ("goods_name",), expressions={"total": "1"})
    with pytest.raises(ValueError, match="at most one parameter"):
        sql.Insert(Order, ("total",), expressions={"total": "%s + %s"})


def test_the_award_is_one_batch_of_the_models_statements():
    statements = f"{BALANCE_ADD.sql};\n{CREDIT_INSERT.sql}"
    assert award_batch(own_transaction=True).sql == f"START TRANSACTION;\n{statements};\nCOMMIT"
    assert award_batch(own_transaction=False).sql == statements


def test_each_statement_is_built_once_per_process():
    assert ORDER_INSERT.sql is ORDER_INSERT.sql
    assert BALANCE_ADD.sql is BALANCE_ADD.sql


@isolate_apps("orders")
def test_a_column_added_to_a_model_without_a_database_default_is_caught():
    class Parcel(models.Model):  # noqa: DJ008
        label = models.CharField(max_length=10)
        weight = models.PositiveIntegerField(default=1)  # a Python default only: the ORM writes it, SQL must too
        note = models.TextField(default="", db_default="")
        shipped_at = models.DateTimeField(null=True)

        class Meta:
            app_label = "orders"

    insert = sql.Insert(Parcel, ("label",))
    assert columns_left_to_no_default(insert) == ["weight"]
    with pytest.raises(ValueError, match=r"Parcel\.weight \(weight\)"):
        insert.sql  # noqa: B018

    written = sql.Insert(Parcel, ("label", "weight"))
    assert columns_left_to_no_default(written) == []
    assert written.sql == "INSERT INTO `orders_parcel` (`label`, `weight`) VALUES (%s, %s)"


@isolate_apps("orders")
def test_a_database_default_the_orm_would_not_write_is_refused():
    class Parcel(models.Model):  # noqa: DJ008
        label = models.CharField(max_length=10, default="new", db_default="")

        class Meta:
            app_label = "orders"

    with pytest.raises(ValueError, match="neither writes it"):
        sql.Insert(Parcel, ()).sql  # noqa: B018


@isolate_apps("orders")
def test_the_instance_is_as_if_read_from_the_database():
    class Parcel(models.Model):  # noqa: DJ008
        label = models.CharField(max_length=10)
        note = models.TextField(default="", db_default="")
        weight = models.PositiveIntegerField(default=0, db_default=0)
        shipped_at = models.DateTimeField(null=True)

        class Meta:
            app_label = "orders"

    parcel = sql.Insert(Parcel, ("weight", "label")).instance("default", [3, "box"], pk=7)
    assert (parcel.pk, parcel.label, parcel.note, parcel.weight, parcel.shipped_at) == (7, "box", "", 3, None)
    assert (parcel._state.adding, parcel._state.db) == (False, "default")
    with pytest.raises(ValueError):
        sql.Insert(Parcel, ("weight", "label")).instance("default", [3], pk=7)


@pytest.mark.django_db
def test_literal_rows_write_each_row_as_the_orm_reads_it(user):
    insert = sql.Insert(Order, ("user", "goods_name", "total", "transaction_id", "created_at"))
    connection = connections[insert.database]
    created_at = timezone.now()
    odd = "O'Brien's \\ \"mug\" ☕ --"
    rows = [
        (user.pk, name, n, f"{n:032x}", connection.ops.adapt_datetimefield_value(created_at))
        for n, name in ((1, "item 1"), (2, odd))
    ]
    with connection.cursor() as cursor:
        cursor.execute(insert.literal_rows(rows))
    written = Order.objects.filter(user=user).order_by("total")
    assert [(o.goods_name, o.total, o.transaction_id, o.created_at) for o in written] == [
        ("item 1", 1, f"{1:032x}", created_at),
        (odd, 2, f"{2:032x}", created_at),
    ]


@pytest.mark.django_db
def test_literal_rows_take_ints_for_integer_columns_and_refuse_what_they_cannot_write():
    at = "2026-11-25 00:00:00.000000"
    assert ORDER_INSERT.literal_rows([(1, "a", 2, "t", at)]).endswith(f" VALUES (1,'a',2,'t','{at}')")
    with pytest.raises(TypeError):
        ORDER_INSERT.literal_rows([("1 OR 1", "a", 2, "t", at)])
    with pytest.raises(ValueError, match="at least one row"):
        ORDER_INSERT.literal_rows([])
    with pytest.raises(ValueError, match="only_if"):
        CREDIT_INSERT.literal_rows([()])
    assert BALANCE_CREATE.literal_rows([(1, 2, "2026-11-25 00:00:00")]).endswith(
        "VALUES (1,2,'2026-11-25 00:00:00') ON DUPLICATE KEY UPDATE `user_id` = `user_id`"
    )


@pytest.mark.django_db
def test_literal_rows_escape_every_value_when_one_needs_it():
    at = "2026-11-25 00:00:00.000000"
    plain = ORDER_INSERT.literal_rows([(1, "mug", 2, "t", at)])
    assert plain.endswith(f" VALUES (1,'mug',2,'t','{at}')")
    escaped = ORDER_INSERT.literal_rows([(1, "mug", 2, "t", at), (2, "O'Brien \\ x", 3, "u", at)])
    assert escaped.endswith(f" VALUES (1,'mug',2,'t','{at}'),(2,'O\\'Brien \\\\ x',3,'u','{at}')")
    assert ORDER_INSERT.literal_rows([(1, "None", 2, "t", at)]).endswith(f" VALUES (1,'None',2,'t','{at}')")
    with pytest.raises(AttributeError):
        ORDER_INSERT.literal_rows([(1, None, 2, "t", at)])


def test_the_relays_statements_name_the_models_table_and_columns_quoted():
    assert statements.claim_lock_batch().sql == (
        "START TRANSACTION;\nSELECT `id`, `payload`, `attempts`, `created_at`, `traceparent`, `tracestate`"
        " FROM `transaction_log` WHERE `status` = %s AND `next_attempt_at` <= %s"
        " ORDER BY `next_attempt_at`, `id` LIMIT %s FOR UPDATE SKIP LOCKED"
    )
    assert statements.claim_lease_batch(2).sql == (
        "UPDATE `transaction_log` SET `next_attempt_at` = %s WHERE `status` = %s AND `id` IN (%s, %s);\nCOMMIT"
    )
    assert statements.mark_published_update(1) == (
        "UPDATE `transaction_log` SET `status` = %s, `published_at` = %s"
        " WHERE `status` = %s AND `next_attempt_at` = %s AND `id` IN (%s)"
    )


def test_the_claim_reads_the_fields_a_claimed_message_holds_in_its_order():
    from dataclasses import fields

    from outbox.claims import ClaimedMessage

    assert tuple(field.name for field in fields(ClaimedMessage)) == statements.CLAIMED_FIELDS
    for name in statements.CLAIMED_FIELDS:
        TransactionLog._meta.get_field(name)  # a renamed or removed field fails here


@pytest.mark.django_db(transaction=True)
def test_a_claimed_row_reads_as_the_orm_reads_it():
    from outbox.claims import claim_due
    from outbox.services import message_create

    message_create(transaction_id="c" * 32, business="test", foreign_key="1", payload={"order_id": 1})
    (claimed,) = claim_due(limit=5).messages
    row = TransactionLog.objects.values_list(*statements.CLAIMED_FIELDS).get(id="c" * 32)
    assert (claimed.id, claimed.payload, claimed.attempts, claimed.created_at) == row[:4]
    assert claimed.created_at.tzinfo is not None


def test_on_a_galera_node_each_statement_is_a_round_trip_of_its_own_with_its_own_parameters():
    batch = order_batch(idempotency_key=True)
    assert batch.round_trips == (
        f"START TRANSACTION;\n{ORDER_INSERT.sql}",
        "SET @creditshop_order_id = LAST_INSERT_ID()",
        MESSAGE_AFTER_ORDER.sql,
        IDEMPOTENCY_KEY_INSERT.sql,
        "COMMIT",
    )
    counts = [statement.count("%s") for statement in batch.round_trips]
    parameters = list(range(sum(counts)))
    split = batch.round_trip_parameters(parameters)
    assert [len(part) for part in split] == counts
    assert [value for part in split for value in part] == parameters
    with pytest.raises(ValueError, match=f"take {len(parameters)} parameters, not {len(parameters) - 1}"):
        batch.round_trip_parameters(parameters[:-1])
    assert award_batch(own_transaction=False).round_trips == (BALANCE_ADD.sql, CREDIT_INSERT.sql)
    assert statements.claim_lease_batch(2).round_trips == (statements.claim_lease_batch(2).statements[0], "COMMIT")


def test_a_literal_percent_sign_takes_no_parameter():
    batch = sql.Transaction(("SELECT '100%%' LIKE %s", "SELECT %s"), begins=False, commits=False)
    assert batch.round_trip_parameters(["1%", 2]) == [["1%"], [2]]

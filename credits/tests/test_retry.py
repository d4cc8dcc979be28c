import pytest
from django.db import InterfaceError, OperationalError, connection, connections

from credits import retry
from credits.errors import MalformedMessage, NewerSchemaVersion, UnsupportedSchemaVersion
from credits.models import DeadLetter

Reason = DeadLetter.Reason


def server_error(code: int) -> Exception:
    """Return the error the real server and driver raise for a statement failing with this code."""
    with pytest.raises(Exception) as info, connection.cursor() as cursor:
        cursor.execute(f"SIGNAL SQLSTATE 'HY000' SET MYSQL_ERRNO = {code}, MESSAGE_TEXT = 'injected'")
    return info.value


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("code", "reason"), [(1213, Reason.DEADLOCK), (1205, Reason.LOCK_WAIT_TIMEOUT), (1927, Reason.DATABASE_UNAVAILABLE)]
)
def test_server_errors_worth_retrying_are_transient(code, reason):
    failure = retry.failure_classify(server_error(code))
    assert (failure.reason, failure.transient) == (reason, True)


@pytest.mark.django_db
def test_other_server_errors_are_not_known_to_be_permanent_so_are_retried():
    failure = retry.failure_classify(server_error(1644))
    assert (failure.reason, failure.transient, failure.outage) == (Reason.UNEXPECTED, True, False)


@pytest.mark.parametrize(
    "exc",
    [
        OperationalError(2006, "MySQL server has gone away"),
        OperationalError(2013, "Lost connection to server during query"),
        OperationalError(2003, "Can't connect to server on '127.0.0.1'"),
        InterfaceError(0, ""),
    ],
)
def test_lost_or_refused_connections_are_transient(exc):
    failure = retry.failure_classify(exc)
    assert (failure.reason, failure.transient) == (Reason.DATABASE_UNAVAILABLE, True)


@pytest.mark.django_db
def test_the_database_being_down_is_transient():
    dead = {**connections["default"].settings_dict, "PORT": 1, "OPTIONS": {"connect_timeout": 1}}
    backend = connections["default"].__class__(dead, alias="down")
    with pytest.raises(OperationalError) as info:
        backend.ensure_connection()
    assert retry.failure_classify(info.value).outage


@pytest.mark.parametrize(
    ("exc", "reason", "transient"),
    [
        (MalformedMessage("bad"), Reason.MALFORMED, False),
        (UnsupportedSchemaVersion("v0"), Reason.UNSUPPORTED_SCHEMA, False),
        # Never retried; forwarded to its version's queue, or dead-lettered once it waited there (credits/versions.py).
        (NewerSchemaVersion("v3"), Reason.VERSION_NOT_SUPPORTED, False),
        # Not known to be permanent, so retried: the design reconsumes every failing message before dead-lettering.
        (ValueError("bug"), Reason.UNEXPECTED, True),
    ],
)
def test_only_a_malformed_message_or_an_unknown_schema_is_permanent(exc, reason, transient):
    failure = retry.failure_classify(exc)
    assert (failure.reason, failure.transient) == (reason, transient)
    assert type(exc).__name__ in failure.error
    assert failure.newer_version == isinstance(exc, NewerSchemaVersion)


def test_transient_failures_retry_up_to_the_limit(settings):
    settings.CREDITS_MAX_RETRIES = 3
    transient = retry.failure_classify(ValueError("x"))
    assert [retry.retry_allowed(transient, retries=n) for n in range(5)] == [True, True, True, False, False]
    assert not retry.retry_allowed(retry.failure_classify(MalformedMessage("x")), retries=0)


def test_backoff_grows_exponentially_with_jitter_and_a_cap(settings):
    settings.CREDITS_RETRY_BASE_SECONDS = 1.0
    settings.CREDITS_RETRY_MAX_SECONDS = 10.0
    for n, ceiling in enumerate([1, 2, 4, 8, 10, 10, 10]):
        delays = [retry.retry_delay(n) for _ in range(200)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert len(set(delays)) > 1
    assert retry.retry_delay(10_000) <= 10.0

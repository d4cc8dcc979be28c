"""The database backend's health check (core/mysql/base.py): no round trip, and a connection the server closed, or
one with an answer nobody read, is not reused."""

import contextlib

import pytest
from django.db import connection, connections

from testkit.db_faults import killed_by_the_server
from testkit.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def unusable(db):
    return lambda: not db.is_usable()


@pytest.fixture
def fresh():
    """This thread's connection, open; closed afterwards whatever state the test left it in."""
    connection.ensure_connection()
    yield connection
    with contextlib.suppress(Exception):
        connection.close()
    connection.connection = None


def test_the_backend_is_in_use():
    assert {type(connections[alias]).__module__ for alias in ("default", "credits")} == {"core.mysql.base"}


def test_an_idle_connection_is_usable_without_a_round_trip(fresh):
    def no_ping(*args):
        raise AssertionError("the health check pinged the server")

    fresh.connection.ping = no_ping

    assert fresh.is_usable()


def test_a_connection_the_server_closed_is_not_usable(fresh):
    killed_by_the_server(fresh)

    wait_for(unusable(fresh), what="the killed connection to be seen as unusable")


def test_a_connection_with_an_unread_answer_is_not_usable(fresh):
    fresh.connection.send_query("SELECT 1")

    wait_for(unusable(fresh), what="the unread answer to arrive")


def test_a_connection_closed_on_this_side_is_not_usable(fresh):
    fresh.connection.close()

    assert not fresh.is_usable()


def test_a_request_after_the_server_closed_the_connection_gets_a_new_one(fresh):
    before = killed_by_the_server(fresh)
    wait_for(unusable(fresh), what="the killed connection to be seen as unusable")

    fresh.close_if_unusable_or_obsolete()  # what Django does as a request starts: the next use is checked
    with fresh.cursor() as cursor:
        cursor.execute("SELECT CONNECTION_ID()")
        (after,) = cursor.fetchone()

    assert after != before

"""The admin login is throttled by django-axes: failures counted in the database (so across every web process), by
address and by username, refused for a while, logged, and shown to staff; API tokens are not affected."""

import logging
import re

import pytest
import requests
from axes.models import AccessAttempt
from django.contrib.auth import get_user_model
from django.test import Client

from accounts.services import api_token_create
from testkit.harness import Cluster
from testkit.processes import free_port, service_env
from testkit.waiting import wait_for

LOGIN = "/admin/login/"
PASSWORD = "correct horse battery staple"
LOCKED = 429  # django-axes' AXES_HTTP_RESPONSE_CODE


def login(client: Client, username: str, password: str, address: str):
    return client.post(LOGIN, {"username": username, "password": password, "next": "/admin/"}, REMOTE_ADDR=address)


@pytest.fixture
def limit(settings) -> int:
    return settings.AXES_FAILURE_LIMIT


@pytest.mark.django_db(transaction=True)
def test_failures_for_one_username_lock_it_from_any_address(make_user, limit, caplog):
    make_user("admin", password=PASSWORD, is_staff=True)
    with caplog.at_level(logging.WARNING, logger="axes"):
        answers = [login(Client(), "admin", "wrong", f"10.0.0.{i}").status_code for i in range(1, limit + 1)]
    assert answers == [200] * (limit - 1) + [LOCKED]  # the login form again, then the refusal
    assert login(Client(), "admin", PASSWORD, "10.0.9.9").status_code == LOCKED  # right password, other address
    assert login(Client(), "someone", "wrong", "10.0.9.9").status_code == 200  # that address is not locked
    assert any("after repeated login failures" in record.getMessage() for record in caplog.records)  # logged


@pytest.mark.django_db(transaction=True)
def test_failures_from_one_address_lock_it_for_every_username(make_user, limit):
    make_user("admin", password=PASSWORD, is_staff=True)
    answers = [login(Client(), f"guess{i}", "wrong", "10.1.0.1").status_code for i in range(limit)]
    assert answers == [200] * (limit - 1) + [LOCKED]
    assert login(Client(), "admin", PASSWORD, "10.1.0.1").status_code == LOCKED
    assert login(Client(), "admin", PASSWORD, "10.1.0.2").status_code == 302  # elsewhere the admin logs in


@pytest.mark.django_db(transaction=True)
def test_a_success_before_the_limit_resets_the_count(make_user, limit):
    make_user("admin", password=PASSWORD, is_staff=True)
    for _ in range(limit - 1):
        assert login(Client(), "admin", "wrong", "10.2.0.1").status_code == 200
    assert login(Client(), "admin", PASSWORD, "10.2.0.1").status_code == 302
    assert login(Client(), "admin", "wrong", "10.2.0.1").status_code == 200


@pytest.mark.django_db(transaction=True)
def test_a_locked_out_address_still_uses_the_api_with_its_token(make_user, limit):
    user = make_user("alice", password=PASSWORD)
    for _ in range(limit):
        login(Client(), "alice", "wrong", "127.0.0.1")
    assert login(Client(), "alice", PASSWORD, "127.0.0.1").status_code == LOCKED
    _, key = api_token_create(user=user)
    assert Client().get("/api/orders/", HTTP_AUTHORIZATION=f"Token {key}").status_code == 200


@pytest.mark.django_db(transaction=True)
def test_staff_see_the_failed_attempts_in_the_admin(make_user, make_staff_client, limit):
    for _ in range(limit):
        login(Client(), "admin", "wrong", "10.3.0.1")
    staff = make_staff_client("security", "axes.view_accessattempt", "axes.view_accessfailurelog")
    attempts = staff.get("/admin/axes/accessattempt/").content.decode()
    assert "10.3.0.1" in attempts and "admin" in attempts
    assert staff.get("/admin/axes/accessfailurelog/").status_code == 200
    assert AccessAttempt.objects.get(username="admin").failures_since_start == limit


class PidWebCluster(Cluster):
    """The web tier whose responses say which worker answered, with connections kept open (each stays on a worker)."""

    def commands(self) -> dict[str, list[str]]:
        commands = super().commands()
        web = ["tests.worker_pid_wsgi:application" if arg == "config.wsgi" else arg for arg in commands["web"]]
        return {**commands, "web": [*web, "--keep-alive=60"]}


def csrf_token(session: requests.Session, url: str) -> tuple[str, str]:
    """GET the login page; return the CSRF form token and the pid of the worker that answered."""
    response = session.get(url, timeout=10)
    response.raise_for_status()
    return re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', response.text).group(1), response.headers[
        "X-Worker-Pid"
    ]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_admin_refuses_the_nth_wrong_password_across_two_gunicorn_workers(make_user, tmp_path):
    limit = 4
    make_user("admin", password=PASSWORD, is_staff=True)
    cluster = PidWebCluster(
        service_env=service_env(),
        workdir=tmp_path,
        port=free_port(),
        web_workers=2,
        extra_env={"AXES_FAILURE_LIMIT": str(limit)},
    )
    try:
        cluster.start("web")
        url = cluster.base_url + LOGIN
        # One kept-open connection per worker: new connections until a second worker answers one. For some seconds,
        # not a number of tries: the second worker may still be booting when the first answers (a loaded CI machine
        # once saw 50 quick tries all taken by the first).
        sessions: dict[str, requests.Session] = {}

        def both_workers_answered() -> bool:
            session = requests.Session()
            _, pid = csrf_token(session, url)
            sessions.setdefault(pid, session)
            return len(sessions) == 2

        wait_for(both_workers_answered, what="gunicorn's second worker to answer", interval=0)

        answers = []
        for attempt in range(limit + 1):
            pid, session = list(sessions.items())[attempt % 2]
            token, answered_by = csrf_token(session, url)
            assert answered_by == pid  # the connection stayed on its worker
            password = PASSWORD if attempt == limit else "wrong"
            response = session.post(
                url,
                data={"csrfmiddlewaretoken": token, "username": "admin", "password": password, "next": "/admin/"},
                headers={"Referer": url},
                allow_redirects=False,
                timeout=10,
            )
            answers.append((response.headers["X-Worker-Pid"], response.status_code))
    finally:
        cluster.stop()

    pids = list(sessions)
    # Wrong passwords alternate between the two workers; the limit-th is refused, and so is the right one after it.
    expected = [(pids[i % 2], 200) for i in range(limit - 1)] + [
        (pids[(limit - 1) % 2], LOCKED),
        (pids[limit % 2], LOCKED),
    ]
    assert answers == expected
    assert get_user_model().objects.get(username="admin").last_login is None

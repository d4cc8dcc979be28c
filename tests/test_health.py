"""/healthz answers 200 with the database and broker up and 503 naming the broker when it is unreachable.

With several broker nodes in CELERY_BROKER_URL, one answering is enough, in whichever place of the list it is. An
app's section that fails or hangs (its database gone silent after the check) is reported as such, within the deadline.
"""

import time

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db


def timed_healthz():
    """Return /healthz's response and the seconds it took to answer.

    The test client loads the middleware on its first request, and WhiteNoise's then indexes every static file (about
    0.05 s of CPU, more on a busy machine), which a served request never pays: gunicorn loads it once per worker.
    """
    client = Client()
    client.handler.load_middleware()
    started = time.monotonic()
    response = client.get("/healthz")
    return response, time.monotonic() - started


def test_healthz_ok():
    response = Client().get("/healthz")

    assert response.status_code == 200
    assert response.json()["checks"]["database"] == "ok"
    assert response.json()["checks"]["broker"] == "ok"


def test_healthz_503_when_broker_unreachable(settings):
    settings.CELERY_BROKER_URL = "amqp://guest:guest@127.0.0.1:1//"

    response = Client().get("/healthz")

    assert response.status_code == 503
    assert response.json()["checks"]["database"] == "ok"
    assert response.json()["checks"]["broker"] != "ok"


def test_healthz_ok_when_only_the_last_broker_node_answers(settings):
    reachable = settings.CELERY_BROKER_URL
    settings.CELERY_BROKER_URL = f"amqp://guest:guest@127.0.0.1:1//;amqp://guest:guest@127.0.0.1:2//;{reachable}"

    response = Client().get("/healthz")

    assert response.status_code == 200, response.json()
    assert response.json()["checks"]["broker"] == "ok"


def test_healthz_503_when_no_broker_node_answers(settings):
    settings.CELERY_BROKER_URL = "amqp://guest:guest@127.0.0.1:1//;amqp://guest:guest@127.0.0.1:2//"

    response = Client().get("/healthz")

    assert response.status_code == 503
    assert response.json()["checks"]["broker"] != "ok"


@pytest.fixture
def mute_server():
    """A TCP server that accepts connections and never says a word: a broker or database gone silent mid-handshake."""
    import socket
    import threading

    server = socket.create_server(("127.0.0.1", 0))
    held = []

    def accept():
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    yield server.getsockname()[1]
    server.close()
    for conn in held:
        conn.close()


@pytest.mark.alone  # its bound is a timing: other workers' load would break it
def test_healthz_answers_within_two_seconds_naming_a_broker_that_says_nothing(settings, mute_server):
    settings.CELERY_BROKER_URL = f"amqp://guest:guest@127.0.0.1:{mute_server}//"
    response, took = timed_healthz()
    assert took < 2.0
    assert response.status_code == 503
    assert response.json()["checks"]["broker"] != "ok"
    assert response.json()["checks"]["database"] == "ok"


@pytest.mark.alone  # its bound is a timing: other workers' load would break it
def test_healthz_answers_within_two_seconds_naming_a_database_that_says_nothing(mute_server):
    from django.db import connections

    from core.deadlines import COMMAND, WEB, database_settings

    # The credits alias, with the web's deadlines, pointed at a server that accepts and never greets.
    credits = connections["credits"]
    saved = {key: credits.settings_dict[key] for key in ("HOST", "PORT")}
    credits.close()
    credits.settings_dict.update(HOST="127.0.0.1", PORT=str(mute_server))
    database_settings(credits.settings_dict, WEB)
    try:
        response, took = timed_healthz()
    finally:
        credits.settings_dict.update(saved)
        database_settings(credits.settings_dict, COMMAND)
    assert took < 2.0
    assert response.status_code == 200  # orders are still taken without the credits database
    assert "no answer within" in response.json()["checks"]["credits_database"]


@pytest.fixture
def section(monkeypatch):
    """Register one more /healthz section for the test: a function given the name "extra"."""
    from core import health

    def register(report):
        monkeypatch.setitem(health._sections, "extra", report)

    return register


@pytest.mark.alone  # its bound is a timing: other workers' load would break it
def test_healthz_answers_in_time_while_a_section_hangs(section):
    import threading

    from core.health import PROBE_DEADLINE_SECONDS

    released = threading.Event()
    section(lambda: released.wait(10) and {})
    try:
        response, took = timed_healthz()
    finally:
        released.set()
    assert PROBE_DEADLINE_SECONDS <= took < 2.0
    assert response.status_code == 200  # a section is informational
    assert "no answer within" in response.json()["extra"]["error"]
    assert "lag_seconds" in response.json()["outbox"]


def test_healthz_reports_a_section_that_fails_and_answers(section):
    def fails():
        raise RuntimeError("the backlog query failed")

    section(fails)
    response = Client().get("/healthz")

    assert response.status_code == 200
    assert response.json()["extra"] == {"error": "RuntimeError: the backlog query failed"}

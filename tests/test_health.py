"""/healthz answers 200 with the database and broker up and 503 naming the broker when it is unreachable.

With several broker nodes in CELERY_BROKER_URL, one answering is enough, in whichever place of the list it is.
"""

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db


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

"""/metrics: closed by METRICS_TOKEN when it is set, and the health of each dependency as a gauge."""

from datetime import date
from unittest import mock

import pytest
from django.db import OperationalError
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from analytics.models import NightlyRun
from testkit.processes import broker_url, free_port

pytestmark = pytest.mark.django_db

TOKEN = "scrape-secret-1"  # noqa: S105


def dependency_up(body: str) -> dict[str, float]:
    return {
        sample.labels["dependency"]: sample.value
        for family in text_string_to_metric_families(body)
        for sample in family.samples
        if sample.name == "creditshop_dependency_up"
    }


def test_without_a_token_configured_anyone_may_scrape(settings):
    settings.METRICS_TOKEN = ""
    assert Client().get("/metrics").status_code == 200


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "",
        "Bearer",
        "Bearer wrong",
        f"Token {TOKEN}",
        f"Basic {TOKEN}",
        f"Bearer {TOKEN}x",
        f"Bearer {TOKEN[:-1]}",
    ],
)
def test_with_a_token_configured_only_its_bearer_may_scrape(settings, authorization):
    settings.METRICS_TOKEN = TOKEN
    headers = {} if authorization is None else {"Authorization": authorization}

    response = Client().get("/metrics", headers=headers)

    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert b"outbox_" not in response.content


@pytest.mark.parametrize("authorization", [f"Bearer {TOKEN}", f"bearer {TOKEN}"])
def test_the_bearer_of_the_token_reads_the_metrics(settings, authorization):
    settings.METRICS_TOKEN = TOKEN

    response = Client().get("/metrics", headers={"Authorization": authorization})

    assert response.status_code == 200
    assert "outbox_lag_seconds" in response.content.decode()


def test_each_dependency_that_answers_is_up(settings):
    assert dependency_up(Client().get("/metrics").content.decode()) == {
        "database": 1.0,
        "credits_database": 1.0,
        "broker": 1.0,
        "cache": 1.0,
    }


def test_a_broker_that_does_not_answer_is_down_and_the_scrape_still_answers(settings):
    settings.CELERY_BROKER_URL = broker_url(port=free_port())  # nothing listens there

    response = Client().get("/metrics")

    assert response.status_code == 200
    assert dependency_up(response.content.decode()) == {
        "database": 1.0,
        "credits_database": 1.0,
        "broker": 0.0,
        "cache": 1.0,
    }


@pytest.mark.parametrize(
    ("reader", "missing"),
    [
        ("outbox.selectors.outbox_lag_seconds", "outbox_lag_seconds"),
        ("analytics.selectors.run_last_finished", "creditshop_nightly_last_run_failed"),
        ("credits.selectors.dead_letters_open_count", "creditshop_credits_dead_letters_open"),
    ],
)
def test_a_gauge_whose_database_does_not_answer_is_left_out_and_the_rest_is_served(reader, missing):
    NightlyRun.objects.create(date=date(2026, 11, 20), status=NightlyRun.Status.SUCCEEDED, finished_at=timezone.now())
    with mock.patch(reader, side_effect=OperationalError(2003, "Can't connect")):
        response = Client().get("/metrics")

    assert response.status_code == 200
    body = response.content.decode()
    assert f"\n{missing} " not in body
    assert "creditshop_dependency_up" in body and "outbox_published_total" in body

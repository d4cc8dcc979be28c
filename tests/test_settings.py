"""Settings come from the environment and a bad value stops start-up with a message naming the variable."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from core import env

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DJANGO_DEBUG", "maybe"),
        ("DATABASE_CONN_MAX_AGE", "ten"),
        ("OUTBOX_MAX_ATTEMPTS", "0"),
        ("ORDERS_RATE_LIMIT", "fast"),
        ("DATABASE_URL", "postgres://localhost/x"),
        ("OUTBOX_SWEEP_SECONDS", "-1"),
        ("IDEMPOTENCY_KEY_RETENTION_HOURS", "a day"),
        ("IDEMPOTENCY_KEY_RETENTION_HOURS", "0"),
        ("CELERY_QUEUE_TYPE", "mirrored"),
        ("CREDITS_OUTAGE_WAIT_SECONDS", "600"),
        ("CREDITS_OUTAGE_WAIT_SECONDS", "soon"),
        ("ORDER_MESSAGE_VERSION", "two"),
        ("ORDER_MESSAGE_VERSION", "3"),
        ("ORDER_MESSAGE_VERSION", "0"),
        ("CREDITS_ACCEPTED_MESSAGE_VERSIONS", "1,two"),
        ("CREDITS_ACCEPTED_MESSAGE_VERSIONS", "1,3"),
        ("CREDITS_ACCEPTED_MESSAGE_VERSIONS", ","),
        ("CREDITS_UNKNOWN_VERSION_WAIT_SECONDS", "-1"),
        ("CREDITS_UNKNOWN_VERSION_WAIT_SECONDS", "an hour"),
        ("CELERY_TASK_SOFT_TIME_LIMIT", "0"),
        ("CELERY_TASK_TIME_LIMIT", "soon"),
        ("CELERY_TASK_TIME_LIMIT", "300"),  # not above the soft limit (300 by default)
        ("ANALYTICS_ORDERS_READ_URL", "postgres://replica/creditshop"),
        ("ANALYTICS_CREDITS_READ_URL", "mysql://root:@replica:3306"),
        ("DATABASE_WSREP_SYNC_WAIT", "16"),
        ("DATABASE_WSREP_SYNC_WAIT", "reads"),
    ],
)
def test_bad_value_fails_start_up_naming_the_variable(name, value):
    result = subprocess.run(
        [sys.executable, "-c", "import django; from django.conf import settings; settings.DEBUG"],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings", name: value},
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert name in result.stderr


@pytest.mark.slow
def test_a_read_url_adds_a_replica_alias_the_nightly_job_reads_from():
    show = (
        "import django; from django.conf import settings; db = settings.DATABASES['credits_nightly_read'];"
        "print(settings.ANALYTICS_READ_DATABASES, db['HOST'], db['NAME'], db['TEST']['MIRROR'])"
    )
    result = subprocess.run(
        [sys.executable, "-c", show],
        cwd=ROOT,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "ANALYTICS_CREDITS_READ_URL": "mysql://reader:@credits-replica:3306/creditshop_credits",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [
        "{'credits':",
        "'credits_nightly_read'}",
        "credits-replica",
        "creditshop_credits",
        "credits",
    ]


@pytest.mark.slow
@pytest.mark.parametrize(("value", "expected"), [("", False), ("0", False), ("1", True)])
def test_wsrep_sync_wait_joins_every_connections_session_settings_only_when_set(value, expected):
    show = (
        "import django; from django.conf import settings;"
        "print(*(settings.DATABASES[alias]['OPTIONS']['init_command'] for alias in ('default', 'credits')), sep='\\n')"
    )
    result = subprocess.run(
        [sys.executable, "-c", show],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings", "DATABASE_WSREP_SYNC_WAIT": value},
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert result.returncode == 0, result.stderr
    commands = result.stdout.splitlines()
    assert len(commands) == 2
    assert all(("wsrep_sync_wait=1" in command) is expected for command in commands)
    assert all(command.startswith("SET sql_mode=") for command in commands)


@pytest.mark.parametrize(("raw", "expected"), [("1", True), ("YES", True), ("off", False), ("", True)])
def test_env_bool_accepts_usual_spellings(monkeypatch, raw, expected):
    monkeypatch.setenv("X_FLAG", raw)

    assert env.env_bool("X_FLAG", True) is expected


def test_env_rate(monkeypatch):
    monkeypatch.setenv("X_RATE", "none")
    assert env.env_rate("X_RATE", "20/second") is None
    monkeypatch.setenv("X_RATE", "5/minute")
    assert env.env_rate("X_RATE", "20/second") == "5/minute"
    monkeypatch.setenv("X_RATE", "0/second")
    with pytest.raises(ImproperlyConfigured, match="X_RATE"):
        env.env_rate("X_RATE", "20/second")


def test_env_int_set(monkeypatch):
    monkeypatch.delenv("X_VERSIONS", raising=False)
    assert env.env_int_set("X_VERSIONS", (1, 2), allowed=(1, 2)) == {1, 2}
    monkeypatch.setenv("X_VERSIONS", " 2 , 1,2 ")
    assert env.env_int_set("X_VERSIONS", (1,), allowed=(1, 2)) == {1, 2}
    monkeypatch.setenv("X_VERSIONS", "1")
    assert env.env_int_set("X_VERSIONS", (1, 2), allowed=(1, 2)) == {1}
    for bad in ("1,3", "one", ",", "1.5"):
        monkeypatch.setenv("X_VERSIONS", bad)
        with pytest.raises(ImproperlyConfigured, match="X_VERSIONS"):
            env.env_int_set("X_VERSIONS", (1, 2), allowed=(1, 2))


def test_database_url_is_parsed(monkeypatch):
    monkeypatch.setenv("X_DB", "mysql://app:secret@db.example:3307/shop")

    config = env.env_database("X_DB", "mysql://root:@127.0.0.1:3306/creditshop")

    assert (config["USER"], config["PASSWORD"], config["HOST"], config["PORT"], config["NAME"]) == (
        "app",
        "secret",
        "db.example",
        3307,
        "shop",
    )

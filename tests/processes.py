"""What a child process started by a test needs to reach this test run's databases and broker."""

import os
import socket
from urllib.parse import quote

from django.conf import settings
from django.db import connections

# The environment variable that gives each database alias to a process (CONTRACT.md).
DATABASE_URL_VARIABLES = {"default": "DATABASE_URL", "credits": "CREDITS_DATABASE_URL"}


def database_url(alias: str = "default", *, user: str | None = None, password: str | None = None) -> str:
    """Return the URL of the database behind an alias (its test database under pytest), optionally as another user."""
    db = connections[alias].settings_dict
    user = db["USER"] if user is None else user
    password = db["PASSWORD"] if password is None else password
    host, port = db["HOST"] or "127.0.0.1", db["PORT"] or 3306
    return f"mysql://{quote(user, safe='')}:{quote(password, safe='')}@{host}:{port}/{db['NAME']}"


def service_env(**extra: str) -> dict[str, str]:
    """Return os.environ plus both database URLs and the broker URL of this test run, then `extra`."""
    env = dict(os.environ)
    env.update({variable: database_url(alias) for alias, variable in DATABASE_URL_VARIABLES.items()})
    env.update(
        CELERY_BROKER_URL=settings.CELERY_BROKER_URL,
        DJANGO_SETTINGS_MODULE="config.settings",
        PYTHONPATH=str(settings.BASE_DIR),
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on right now (other test runs share the machine)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]

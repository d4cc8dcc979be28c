"""Strict readers for settings that come from the environment.

django-environ parses URLs well but forgives bad scalars (``DJANGO_DEBUG=maybe`` reads as False), so every
scalar goes through these helpers: a value that does not parse stops start-up with a message naming the variable.
"""

import os

import environ
from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def env_str(name: str, default: str) -> str:
    """Return the variable as text, or the default when it is unset or empty."""
    value = os.environ.get(name, "").strip()
    return value or default


def env_bool(name: str, default: bool) -> bool:
    """Return the variable as a boolean, refusing anything but the usual spellings."""
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean (use one of {sorted(_TRUE | _FALSE)})")


def env_int(name: str, default: int, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """Return the variable as an integer within [minimum, maximum]."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer") from None
    if minimum is not None and value < minimum or maximum is not None and value > maximum:
        raise ImproperlyConfigured(f"{name}={value} is out of range [{minimum}, {maximum}]")
    return value


def env_float(name: str, default: float, *, minimum: float = 0.0, maximum: float | None = None) -> float:
    """Return the variable as a float within [minimum, maximum]."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a number") from None
    if value < minimum:
        raise ImproperlyConfigured(f"{name}={value} is below {minimum}")
    if maximum is not None and value > maximum:
        raise ImproperlyConfigured(f"{name}={value} is above {maximum}")
    return value


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    """Return the variable as one of the given words (case-insensitive)."""
    value = env_str(name, default).lower()
    if value not in choices:
        raise ImproperlyConfigured(f"{name}={value!r} is not one of {list(choices)}")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    """Return a comma-separated variable as a list of non-empty items."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_int_set(name: str, default: tuple[int, ...], *, allowed: tuple[int, ...]) -> frozenset[int]:
    """Return a comma-separated variable as a non-empty set of integers, each one of `allowed`."""
    items = env_list(name, [str(value) for value in default])
    try:
        values = frozenset(int(item) for item in items)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={','.join(items)!r} is not a comma-separated list of integers") from None
    if not values or not values <= set(allowed):
        raise ImproperlyConfigured(
            f"{name}={','.join(items)!r} must list one or more of {', '.join(map(str, allowed))}"
        )
    return values


def env_database(name: str, default: str) -> dict:
    """Return a Django DATABASES entry parsed from a database URL."""
    url = env_str(name, default)
    try:
        config = environ.Env.db_url_config(url)
    except Exception as exc:  # environ raises several types for malformed URLs
        raise ImproperlyConfigured(f"{name}={url!r} is not a database URL: {exc}") from None
    if config.get("ENGINE") != "django.db.backends.mysql":
        raise ImproperlyConfigured(f"{name} must be a mysql:// URL (MySQL 8 or MariaDB 10.6+), got {url!r}")
    if not config.get("NAME"):
        raise ImproperlyConfigured(f"{name}={url!r} names no database")
    return config


def env_rate(name: str, default: str) -> str | None:
    """Return a DRF rate string such as '20/second', or None when set to 'none'."""
    raw = env_str(name, default)
    if raw.lower() == "none":
        return None
    count, _, period = raw.partition("/")
    if not count.isdigit() or int(count) < 1 or not period or period[0] not in "smhd":
        raise ImproperlyConfigured(f"{name}={raw!r} is not a rate such as '20/second' or 'none'")
    return raw

"""The project's settings plus django-rest-knox, for bench/bench_auth.py's comparison only (knox is not deployed)."""

from config.settings import *  # noqa: F403
from config.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "knox"]

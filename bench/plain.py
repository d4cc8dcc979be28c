"""Settings for the plain baseline of bench_orders.py: the service's own, but for the URLconf (bench/plain_urls.py).

DJANGO_SETTINGS_MODULE=plain PYTHONPATH=bench gunicorn config.wsgi
"""

from config.settings import *  # noqa: F403 (the service's settings, unchanged but for the URLs)

ROOT_URLCONF = "plain_urls"

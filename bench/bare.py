"""Settings for the bare lower bound of bench_orders.py: the service's own, but for the URLconf (bench/bare_urls.py).

DJANGO_SETTINGS_MODULE=bare PYTHONPATH=bench gunicorn config.wsgi
"""

from config.settings import *  # noqa: F403 (the service's settings, unchanged but for the URLs)

ROOT_URLCONF = "bare_urls"

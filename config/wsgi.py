"""WSGI entry point: `gunicorn config.wsgi`."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

from core.tracing import tracing_setup  # noqa: E402 (needs the settings module named above)

# Before the application is built: the Django instrumentation adds its middleware to the settings' list. Each gunicorn
# worker imports this module after the fork (unless --preload), so each has its own export thread. No span per SQL
# statement here: the order request's four statements would be four more spans per order, each costing CPU of the
# order of the statement it records (docs/PERFORMANCE.md, "Tracing overhead"); the request span covers them.
tracing_setup(service_name="creditshop-web", django=True, sql=False)
application = get_wsgi_application()

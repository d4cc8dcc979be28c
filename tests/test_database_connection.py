"""A database connection the server killed heals on the next request, thanks to CONN_HEALTH_CHECKS.

Django's test client skips the per-request connection check, so these requests go through the real WSGI handler.
"""

import io
import json
from wsgiref.util import setup_testing_defaults

import pytest
from django.core.handlers.wsgi import WSGIHandler
from django.db import connection

from accounts.services import api_token_create
from orders.models import Order
from testkit.db_faults import killed_by_the_server


def wsgi_post(handler: WSGIHandler, path: str, body: dict, token: str) -> int:
    raw = json.dumps(body).encode()
    environ = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": path,
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(raw)),
        "HTTP_AUTHORIZATION": f"Token {token}",
        "wsgi.input": io.BytesIO(raw),
    }
    setup_testing_defaults(environ)
    statuses = []
    response = handler(environ, lambda status, headers: statuses.append(status))
    response.close()
    return int(statuses[0].split()[0])


@pytest.mark.django_db(transaction=True)
def test_killed_connection_heals_on_next_request(user):
    handler = WSGIHandler()
    token = api_token_create(user=user)[1]
    assert wsgi_post(handler, "/api/orders/", {"goods_name": "a", "total": 1}, token) == 201
    killed_by_the_server(connection)

    assert wsgi_post(handler, "/api/orders/", {"goods_name": "b", "total": 2}, token) == 201
    assert Order.objects.count() == 2

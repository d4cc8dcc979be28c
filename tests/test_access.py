"""Access control across every route: nothing but the probes and the API description answers an anonymous caller.

A new route lands in one of the lists below or this test fails, so no endpoint goes out without a decision.
"""

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db

# Probes, the API description, the favicon and the API's JSON 404, meant to be open. /metrics is open unless
# METRICS_TOKEN is set (tests/test_metrics_endpoint.py).
PUBLIC = {
    "healthz",
    "metrics",
    "api/schema/",
    "api/docs/",
    "api/redoc/",
    "api/redoc/redoc.standalone.js",
    "favicon.ico",
    "^api/",
}
API = {
    "api/orders/": "/api/orders/",
    "api/orders/<int:order_id>/": "/api/orders/1/",
    "api/transactions/<str:transaction_id>/": "/api/transactions/0123456789abcdef0123456789abcdef/",
    "api/credits/": "/api/credits/",
}
STAFF_PAGES = {
    "admin/pipeline/": "/admin/pipeline/",
    "reports/": "/reports/",
    "reports/runs/<int:run_id>/": "/reports/runs/1/",
    "reports/<str:day>/": "/reports/2026-11-20/",
    "reports/<str:day>/<str:name>": "/reports/2026-11-20/report.html",
}


def routes(resolver: URLResolver, prefix: str = "") -> set[str]:
    found = set()
    for pattern in resolver.url_patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLPattern):
            found.add(route)
        elif not route.startswith("admin/"):
            found |= routes(pattern, route)
    return found


def test_every_route_has_an_access_decision():
    assert routes(get_resolver()) == PUBLIC | set(API) | set(STAFF_PAGES)


@pytest.mark.parametrize("path", API.values())
@pytest.mark.parametrize("method", ["get", "post"])
def test_api_refuses_anonymous_callers(path, method):
    assert getattr(APIClient(), method)(path).status_code == 401


@pytest.mark.parametrize("path", [*STAFF_PAGES.values(), "/admin/", "/admin/outbox/transactionlog/"])
def test_staff_pages_send_customers_to_the_login_page(path, make_user):
    client = Client()
    client.force_login(make_user("customer"))
    response = client.get(path)
    assert response.status_code == 302
    assert "/login/" in response["Location"]


@pytest.mark.parametrize(
    "path",
    ["/admin/outbox/transactionlog/", "/admin/credits/deadletter/", "/admin/orders/order/", "/admin/analytics/"],
)
def test_staff_without_model_permissions_cannot_open_the_admin_lists(path, make_staff_client):
    client = make_staff_client("intern")
    assert client.get(path).status_code in (403, 404)

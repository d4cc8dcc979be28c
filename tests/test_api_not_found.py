"""Any path under /api/ that no route matches answers the API's JSON 404, with DEBUG on (Django's HTML page) or off."""

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db

UNMATCHED = ["/api/orders/null,null/", "/api/orders/abc/", "/api/nope/", "/api/", "/api/orders/1/extra/", "/api/x"]


@pytest.mark.parametrize("debug", [True, False])
@pytest.mark.parametrize("path", UNMATCHED)
def test_an_unmatched_api_path_answers_json(settings, debug, path):
    settings.DEBUG = debug

    response = Client().get(path)

    assert response.status_code == 404
    assert response["Content-Type"] == "application/json"
    assert response.json() == {"detail": "Not found."}


@pytest.mark.parametrize("debug", [True, False])
def test_a_missing_trailing_slash_still_redirects_to_the_route(settings, debug):
    settings.DEBUG = debug

    response = Client().get("/api/orders?limit=5")

    assert response.status_code == 301
    assert response["Location"] == "/api/orders/?limit=5"


def test_outside_the_api_an_unknown_path_keeps_djangos_page(settings):
    settings.DEBUG = False

    response = Client().get("/no-such-page/")

    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")

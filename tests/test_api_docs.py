"""/api/redoc/ needs nothing from outside: no font links, and a bundle without Redocly's CDN image."""

import re

import pytest
from django.contrib.staticfiles import finders
from django.test import Client

from core.api_docs import CDN_LOGO, REDOC_BUNDLE

pytestmark = pytest.mark.django_db


def test_the_page_links_no_fonts_and_loads_the_bundle_from_this_site():
    page = Client().get("/api/redoc/").content.decode()

    assert "fonts.googleapis.com" not in page and "fonts.gstatic.com" not in page
    assert re.findall(r'<(?:script|link)[^>]*(?:src|href)="([^"]+)"', page) == ["/api/redoc/redoc.standalone.js"]


def test_the_bundle_is_the_sidecars_without_the_cdn_image():
    with open(finders.find(REDOC_BUNDLE), "rb") as original:
        source = original.read()
    assert CDN_LOGO in source  # what the replacement is for: a newer ReDoc must be looked at again

    response = Client().get("/api/redoc/redoc.standalone.js")

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/javascript")
    served = response.content
    assert b"cdn.redoc.ly" not in served
    assert not any(line.startswith(b"//# sourceMappingURL=") for line in served.splitlines())
    assert len(served) > len(source) * 0.99  # the rest of the bundle is intact

"""The ReDoc page with nothing from outside: no Google Fonts, and no image from Redocly's CDN.

drf-spectacular's ReDoc template links Google Fonts, and ReDoc's bundle always shows Redocly's logo from
cdn.redoc.ly in its sidebar (no ReDoc option turns it off). Offline, both are failed requests and console errors; on
line, they tell a third party who reads the docs. The page here has no font links, and its bundle is the sidecar's
copy with that one image replaced by an empty inline one.
"""

import functools

from django.contrib.staticfiles import finders
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from drf_spectacular.views import SpectacularRedocView

REDOC_BUNDLE = "drf_spectacular_sidecar/redoc/bundles/redoc.standalone.js"
CDN_LOGO = b"https://cdn.redoc.ly/redoc/logo-mini.svg"
EMPTY_IMAGE = b"data:image/svg+xml,%3Csvg xmlns='http://www.w3.org/2000/svg' width='1' height='1'/%3E"
SOURCE_MAP_COMMENT = b"//# sourceMappingURL="
BUNDLE_MAX_AGE_SECONDS = 24 * 3600


@functools.cache
def redoc_bundle_source() -> bytes:
    """Return ReDoc's standalone bundle without its CDN image (and without a source map this site does not serve)."""
    path = finders.find(REDOC_BUNDLE)
    if path is None:
        raise FileNotFoundError(f"{REDOC_BUNDLE} not found: is drf-spectacular-sidecar installed?")
    with open(path, "rb") as bundle:
        source = bundle.read()
    lines = [line for line in source.split(b"\n") if not line.startswith(SOURCE_MAP_COMMENT)]
    return b"\n".join(lines).replace(CDN_LOGO, EMPTY_IMAGE)


def redoc_bundle(request: HttpRequest) -> HttpResponse:
    """Serve ReDoc's bundle as the docs page loads it (redoc_bundle_source)."""
    response = HttpResponse(redoc_bundle_source(), content_type="text/javascript; charset=utf-8")
    response["Cache-Control"] = f"public, max-age={BUNDLE_MAX_AGE_SECONDS}"
    return response


class OfflineRedocView(SpectacularRedocView):
    """drf-spectacular's ReDoc page, without font links, loading the bundle from redoc_bundle."""

    template_name = "core/redoc.html"

    @staticmethod
    def _redoc_standalone() -> str:
        return reverse("redoc-bundle")

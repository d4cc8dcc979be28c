"""The API's content negotiation answers as DRF's does, and the common Accept headers without parsing them."""

import pytest
from rest_framework.exceptions import NotAcceptable
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import BrowsableAPIRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.settings import api_settings
from rest_framework.test import APIRequestFactory

from core.negotiation import ContentNegotiation

RENDERERS = [JSONRenderer(), BrowsableAPIRenderer()]


def negotiate(negotiation, path: str, accept: str | None, format_suffix: str | None = None):
    headers = {} if accept is None else {"HTTP_ACCEPT": accept}
    request = Request(APIRequestFactory().get(path, **headers))
    try:
        renderer, media_type = negotiation.select_renderer(request, RENDERERS, format_suffix)
    except NotAcceptable:
        return NotAcceptable
    return type(renderer), media_type


@pytest.mark.parametrize("path", ["/api/orders/", "/api/orders/?format=api", "/api/orders/?limit=5"])
@pytest.mark.parametrize("format_suffix", [None, "api"])
@pytest.mark.parametrize(
    "accept",
    [
        None,
        "*/*",
        "application/json",
        "text/html",
        "application/json; indent=4",
        "text/html,application/xhtml+xml,*/*;q=0.8",
        "application/*",
        " */*",
    ],
)
def test_it_answers_as_drf_does(path, format_suffix, accept):
    ours = negotiate(ContentNegotiation(), path, accept, format_suffix)
    assert ours == negotiate(DefaultContentNegotiation(), path, accept, format_suffix)


@pytest.mark.parametrize("accept", [None, "*/*", "application/json"])
def test_the_common_accept_headers_are_answered_without_parsing(monkeypatch, accept):
    def parse(*args):
        raise AssertionError("parsed the Accept header")

    monkeypatch.setattr(DefaultContentNegotiation, "_get_parsed_accept_list", parse)
    assert negotiate(ContentNegotiation(), "/api/orders/", accept) == (JSONRenderer, "application/json")


def test_the_api_uses_it():
    assert api_settings.DEFAULT_CONTENT_NEGOTIATION_CLASS is ContentNegotiation

"""Content negotiation: DRF's, with its answer for the Accept headers nearly every API client sends worked out fast."""

from rest_framework.negotiation import DefaultContentNegotiation


class ContentNegotiation(DefaultContentNegotiation):
    """DRF's DefaultContentNegotiation, answering no Accept header, ``*/*`` and the first renderer's own media type
    (what HTTP libraries and the API's clients send) without parsing the header or the query string.

    DRF's answer for those, with no format suffix or ``?format=``, is always the first renderer and its media type;
    building the request's headers and query dict and parsing the Accept list to find it is work on every order for
    a known answer. Anything else goes to DRF's negotiation.
    """

    def select_renderer(self, request, renderers, format_suffix=None):
        meta = request.META
        if renderers and not format_suffix and not meta.get("QUERY_STRING"):
            first = renderers[0]
            accept = meta.get("HTTP_ACCEPT", "*/*")
            if accept == "*/*" or accept == first.media_type:
                return first, first.media_type
        return super().select_renderer(request, renderers, format_suffix)

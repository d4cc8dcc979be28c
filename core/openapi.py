"""What the OpenAPI document says about errors and links, in one place: the error bodies core.api answers with."""

from drf_spectacular.utils import OpenApiExample, OpenApiParameter, OpenApiResponse
from rest_framework import serializers


class ErrorSerializer(serializers.Serializer):
    """The body of every error that is not a field validation error (what core.api.exception_handler sends)."""

    detail = serializers.CharField()


# A 400 names each offending field (or header) with its messages; a body that is not JSON gets {"detail": ...}.
VALIDATION_ERROR_SCHEMA = {
    "type": "object",
    "additionalProperties": {"anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "string"}]},
    "example": {"total": ["Ensure this value is less than or equal to 10000."], "user_id": ["Unknown field."]},
}

ERROR_DESCRIPTIONS = {
    401: "No `Authorization: Token <key>` header, or an unknown token.",
    404: "No such resource for this caller (another user's order is 404 too).",
    413: "The request body is larger than 64 KiB.",
    415: "The body is not `application/json`.",
    422: "The Idempotency-Key was used before with a different body.",
    429: "Over the per-user rate limit; retry after the seconds in `Retry-After`.",
}
ERROR_EXAMPLES = {
    401: "Authentication credentials were not provided.",
    404: "Not found.",
    413: "Request body is larger than 65536 bytes.",
    415: 'Unsupported media type "text/plain" in request.',
    422: "Idempotency-Key was already used with a different request body.",
    429: "Request was throttled. Expected available in 1 second.",
}

RETRY_AFTER = OpenApiParameter(
    "Retry-After",
    {"type": "integer", "minimum": 0},
    OpenApiParameter.HEADER,
    required=True,
    response=[429],
    description="Seconds until the rate limit lets a request through again.",
)


def error_responses(*statuses: int) -> dict[int, OpenApiResponse]:
    """Return the documented responses for these error statuses, each with its body schema and an example."""
    responses = {}
    for code in statuses:
        if code == 400:
            responses[code] = OpenApiResponse(
                VALIDATION_ERROR_SCHEMA, description="The body or the Idempotency-Key header did not validate."
            )
        else:
            responses[code] = OpenApiResponse(
                ErrorSerializer,
                description=ERROR_DESCRIPTIONS[code],
                examples=[OpenApiExample(str(code), value={"detail": ERROR_EXAMPLES[code]}, status_codes=[code])],
            )
    return responses


# Links let a client (and schemathesis' stateful tests) follow a created order to its other operations.
ORDER_LINKS = {
    "GetOrder": {
        "operationId": "orders_retrieve",
        "parameters": {"order_id": "$response.body#/id"},
        "description": "Read the order just placed.",
    },
    "CheckTransaction": {
        "operationId": "transactions_retrieve",
        "parameters": {"transaction_id": "$response.body#/transaction_id"},
        "description": "Ask whether the transaction behind the order's message committed.",
    },
}


# Answered by gunicorn before the application sees the request, as an HTML page: only a query string can make the
# request line this long, so it is documented on the operations that take query parameters.
URI_TOO_LONG = {
    "description": "The request line is longer than the server's limit of 4,094 bytes (a query string that long)."
}


def add_links(result: dict, generator, request, public) -> dict:
    """Say what drf-spectacular cannot (a postprocessing hook): the links, that orders refuse unknown fields, and the
    server's limit on the request line."""
    created = result["paths"]["/api/orders/"]["post"]["responses"]["201"]
    created["links"] = ORDER_LINKS
    result["components"]["schemas"]["OrderInput"]["additionalProperties"] = False
    for operations in result["paths"].values():
        for operation in operations.values():
            if any(parameter.get("in") == "query" for parameter in operation.get("parameters", ())):
                operation["responses"].setdefault("414", URI_TOO_LONG)
    return result

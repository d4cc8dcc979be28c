"""The Idempotency-Key request header: its name, where WSGI puts it, and which keys the order API accepts."""

IDEMPOTENCY_HEADER = "Idempotency-Key"
IDEMPOTENCY_KEY_MAX = 255
# The IETF draft (httpapi-idempotency-key-header) makes the key a structured-field string: printable ASCII, 0x20 to
# 0x7E. The same rule as a JSON Schema pattern, for the OpenAPI document.
IDEMPOTENCY_KEY_PATTERN = "^[ -~]*$"
IDEMPOTENCY_KEY_RULE = f"1 to {IDEMPOTENCY_KEY_MAX} printable ASCII characters (0x20 to 0x7E)"
# Read from META, as request.headers would find it: building request.headers costs more than the look-up.
IDEMPOTENCY_META_KEY = "HTTP_" + IDEMPOTENCY_HEADER.upper().replace("-", "_")


def idempotency_key_valid(key: str) -> bool:
    """Return whether `key` is an Idempotency-Key this API accepts (IDEMPOTENCY_KEY_RULE)."""
    # isprintable() refuses the control characters (tab, DEL); isascii() what WSGI decoded from bytes over 0x7E.
    return 1 <= len(key) <= IDEMPOTENCY_KEY_MAX and key.isascii() and key.isprintable()

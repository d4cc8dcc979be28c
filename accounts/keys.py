"""API keys: how one is made, the prefix that finds its row, and the keyed digest that is all the database keeps."""

import hmac
import secrets

from django.conf import settings

# What every key made here begins with: a key never begins with "-" (which a command line reads as an option), and a
# secret scanner can recognise a leaked one. Keys made before it have no mark and keep working.
KEY_MARK = "cs_"
# Characters of a key kept in clear to find its row (and to let a person tell their tokens apart): the first ones
# after the mark, which carry 48 bits of a new key, far too few to use it.
KEY_PREFIX_LENGTH = 8
# 32 random bytes, URL-safe base64: 43 characters, 256 bits. A guess is hopeless, so one fast keyed hash is
# enough (no slow password hash per request, as for passwords).
KEY_BYTES = 32
DIGEST_LENGTH = 64


def key_new() -> str:
    """Return a new random API key: the mark, then the random part."""
    return KEY_MARK + secrets.token_urlsafe(KEY_BYTES)


def key_prefix(key: str) -> str:
    """Return the clear part of `key` its row is stored with: the first characters after the mark, if it has one."""
    return key.removeprefix(KEY_MARK)[:KEY_PREFIX_LENGTH]


def key_prefixes(key: str) -> tuple[str, str]:
    """Return the two prefixes `key`'s row may be stored with, the same one twice for a key without the mark.

    A key made before the mark was stored with its first characters, and 1 in 64**3 of those begin with the mark
    by chance: for a marked key the row may be either one's, and the digest decides.
    """
    return key_prefix(key), key[:KEY_PREFIX_LENGTH]


def key_digest(key: str) -> str:
    """Return HMAC-SHA256 of `key` under API_TOKEN_DIGEST_KEY, in hex: a stolen table alone checks no guess."""
    return hmac.digest(settings.API_TOKEN_DIGEST_KEY.encode(), key.encode(), "sha256").hex()


def digests_equal(a: str, b: str) -> bool:
    """Compare two digests in constant time."""
    return hmac.compare_digest(a, b)

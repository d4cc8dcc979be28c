"""API tokens: the database keeps a key's prefix and keyed digest, never the key."""

from django.conf import settings
from django.db import models
from django.utils import timezone

from accounts.keys import DIGEST_LENGTH, KEY_PREFIX_LENGTH


class ApiToken(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    # Free text telling a user's tokens apart ("laptop", "ci"); revoke_api_tokens --name revokes by it.
    name = models.CharField(max_length=64, blank=True, default="")
    # Not unique: two keys may share a prefix; the digest decides which row, if any, a key is.
    prefix = models.CharField(max_length=KEY_PREFIX_LENGTH, db_index=True, db_collation="ascii_bin")
    digest = models.CharField(max_length=DIGEST_LENGTH, db_collation="ascii_bin")
    created_at = models.DateTimeField(default=timezone.now)
    # None: never expires.
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "api_tokens"
        verbose_name = "API token"

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.name or 'unnamed'})"

    def is_expired(self, now=None) -> bool:
        return self.expires_at is not None and self.expires_at <= (now or timezone.now())

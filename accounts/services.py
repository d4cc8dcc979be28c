"""Writes of API tokens: create one (its key returned once, only its digest kept) and revoke them."""

import logging
from datetime import datetime

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import QuerySet

from accounts.keys import key_digest, key_new, key_prefix
from accounts.models import ApiToken
from core.errors import ApplicationError

logger = logging.getLogger(__name__)
NAME_MAX = ApiToken._meta.get_field("name").max_length


def api_token_create(
    *, user: AbstractBaseUser, name: str = "", expires_at: datetime | None = None
) -> tuple[ApiToken, str]:
    """Create an API token for `user` and return it with its key: the only time the key exists outside the caller."""
    if len(name) > NAME_MAX:
        raise ApplicationError(f"a token name has at most {NAME_MAX} characters")
    key = key_new()
    token = ApiToken.objects.create(
        user=user, name=name, prefix=key_prefix(key), digest=key_digest(key), expires_at=expires_at
    )
    logger.info("API token %s created for user %s (name %r, expires %s)", token.pk, user.pk, name, expires_at)
    return token, key


@transaction.atomic
def _revoke(tokens: QuerySet, *, by: str) -> int:
    # Deleted one by one through the ORM, so each token's post_delete drops its cached row (accounts/authentication.py).
    revoked = list(tokens.select_for_update().order_by("pk"))
    ids = [token.pk for token in revoked]
    for token in revoked:
        token.delete()
    if ids:
        logger.info("API tokens %s revoked by %s", ids, by)
    return len(ids)


def api_tokens_revoke(*, user: AbstractBaseUser, name: str | None = None, by: str = "command") -> int:
    """Revoke `user`'s API tokens (only those called `name` when given) and return how many; refused at once."""
    tokens = ApiToken.objects.filter(user=user)
    if name is not None:
        tokens = tokens.filter(name=name)
    return _revoke(tokens, by=by)


def api_tokens_revoke_by_ids(*, ids: list[int], by: str) -> int:
    """Revoke the API tokens with these ids (an admin action) and return how many; refused at once."""
    return _revoke(ApiToken.objects.filter(pk__in=ids), by=by)

"""Reads for the accounts commands."""

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser

from core.errors import ApplicationError


def user_by_username(username: str) -> AbstractBaseUser:
    """Return the user called `username`, or raise ApplicationError naming it."""
    user_model = get_user_model()
    try:
        return user_model.objects.get_by_natural_key(username)
    except user_model.DoesNotExist:
        raise ApplicationError(f"no user named {username!r}") from None

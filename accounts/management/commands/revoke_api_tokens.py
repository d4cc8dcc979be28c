"""Revoke a user's API tokens (those with one name, or all): refused from the next request on."""

from django.core.management.base import BaseCommand, CommandError

from accounts.selectors import user_by_username
from accounts.services import api_tokens_revoke
from core.errors import ApplicationError


class Command(BaseCommand):
    help = "Revoke USERNAME's API tokens (only those called --name NAME when given) and print how many."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--name", help="revoke only the tokens with this name")

    def handle(self, *args, username: str, name: str | None, **options):
        try:
            revoked = api_tokens_revoke(user=user_by_username(username), name=name)
        except ApplicationError as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(f"revoked {revoked}")

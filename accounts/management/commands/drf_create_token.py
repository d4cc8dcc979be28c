"""DRF's drf_create_token, kept working for one release: it now makes a hashed API token (create_api_token).

This app comes before rest_framework.authtoken in INSTALLED_APPS, so this command answers to the name. The output
keeps DRF's shape ("Generated token <key> for user <username>"), so scripts reading the third word still work. Unlike
DRF's, it cannot show an existing key again (none is stored): each call makes a new token named "drf_create_token";
-r revokes the earlier ones of that name first.
"""

from django.core.management.base import BaseCommand, CommandError

from accounts.selectors import user_by_username
from accounts.services import api_token_create, api_tokens_revoke
from core.errors import ApplicationError

NAME = "drf_create_token"


class Command(BaseCommand):
    help = "Deprecated: use create_api_token. Create a hashed API token for USERNAME and print it once."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("-r", "--reset", action="store_true", help=f"revoke the user's {NAME!r} tokens first")

    def handle(self, *args, username: str, reset: bool, **options):
        try:
            user = user_by_username(username)
        except ApplicationError as exc:
            raise CommandError(exc.message) from exc
        if reset:
            api_tokens_revoke(user=user, name=NAME)
        _, key = api_token_create(user=user, name=NAME)
        self.stderr.write("drf_create_token is deprecated: use create_api_token (a name, an expiry)")
        self.stdout.write(f"Generated token {key} for user {username}")

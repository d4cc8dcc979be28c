"""Create an API token and print its key once, on the last line (the database keeps only its digest)."""

from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from accounts.selectors import user_by_username
from accounts.services import api_token_create
from core.errors import ApplicationError

# Ten years: a longer lifetime is a typo, and far dates overflow DATETIME.
EXPIRES_DAYS_MAX = 3650


class Command(BaseCommand):
    help = (
        "Create an API token for USERNAME (header: Authorization: Token <key>) and print its key once, on the last "
        "line of output. Only a digest is stored: a lost key cannot be shown again, only revoked and replaced."
    )

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--name", default="", help="tells the user's tokens apart (revoke_api_tokens --name)")
        parser.add_argument("--expires-days", type=int, help=f"refused after this many days (1..{EXPIRES_DAYS_MAX})")

    def handle(self, *args, username: str, name: str, expires_days: int | None, **options):
        if expires_days is not None and not 1 <= expires_days <= EXPIRES_DAYS_MAX:
            raise CommandError(f"--expires-days must be between 1 and {EXPIRES_DAYS_MAX}, not {expires_days}")
        expires_at = timezone.now() + timedelta(days=expires_days) if expires_days else None
        try:
            token, key = api_token_create(user=user_by_username(username), name=name, expires_at=expires_at)
        except ApplicationError as exc:
            raise CommandError(exc.message) from exc
        expiry = f"expires {token.expires_at:%Y-%m-%d %H:%M:%S} UTC" if token.expires_at else "never expires"
        self.stdout.write(
            f"API token {token.pk} for {username} (name {name!r}, {expiry}). The key, shown this once:\n{key}"
        )

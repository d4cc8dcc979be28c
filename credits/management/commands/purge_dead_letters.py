"""Delete dead-lettered credit messages that were replayed or discarded long enough ago; open ones always stay."""

from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from credits.services import dead_letters_purge_resolved


class Command(BaseCommand):
    help = (
        "Delete dead letters replayed or discarded more than --days days ago (default 90), in small batches, and "
        "print how many. Open dead letters are never deleted."
    )

    def add_arguments(self, parser):
        parser.add_argument("--days", type=int, default=90, help="keep resolved dead letters this many days")

    def handle(self, *args, **options):
        days = options["days"]
        if days < 1:
            raise CommandError("--days must be at least 1")
        deleted = dead_letters_purge_resolved(resolved_before=timezone.now() - timedelta(days=days))
        self.stdout.write(f"deleted {deleted}")

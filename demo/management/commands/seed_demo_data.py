"""Bulk-load a consistent demo history of orders, outbox rows and credits, optionally with planted faults."""

from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone
from tqdm import tqdm

from core.arguments import parse_day
from demo.plant import plant_inconsistencies
from demo.seed import seed_demo_data


class Command(BaseCommand):
    help = (
        "Load N orders spread over D days ending on --end (default: yesterday, UTC), each with its published "
        "transaction_log row (in the orders database, DATABASE_URL) and its credit (in the credits database, "
        "CREDITS_DATABASE_URL). Run it against databases no one else is writing orders or credits to."
    )

    def add_arguments(self, parser):
        parser.add_argument("--orders", type=int, required=True, help="number of orders to load")
        parser.add_argument("--days", type=int, required=True, help="number of days to spread them over")
        parser.add_argument("--users", type=int, default=None, help="distinct users (default: orders / 20)")
        parser.add_argument("--end", type=parse_day, default=None, help="last day, YYYY-MM-DD (default: yesterday)")
        parser.add_argument("--seed", type=int, default=None, help="random seed, for a reproducible history")
        parser.add_argument(
            "--plant",
            action="store_true",
            help="then break a few orders of the last day in each way the nightly checks detect",
        )

    def handle(self, *args, orders, days, users, end, seed, plant, **options):
        if orders < 1 or days < 1:
            raise CommandError("--orders and --days must be positive")
        users = users if users is not None else max(1, orders // 20)
        if users < 1:
            raise CommandError("--users must be positive")
        end = end or timezone.now().date() - timedelta(days=1)
        with tqdm(total=orders * 3, unit="rows", unit_scale=True, desc="seeding", disable=None) as bar:
            result = seed_demo_data(orders=orders, days=days, users=users, end=end, seed=seed, on_progress=bar.update)
        self.stdout.write(
            f"loaded {result.orders:,} orders for {result.users:,} users over {days} days ending {end}: "
            f"{result.rows:,} rows in {result.seconds:.1f}s ({result.rows_per_second:,.0f} rows/s), "
            f"order ids {result.first_order_id}..{result.last_order_id}"
        )
        if plant:
            planted = plant_inconsistencies(day=end, seed=seed)
            self.stdout.write(f"planted on {end} (the ids the nightly checks must report):")
            for name, ids in planted.items():
                note = "" if ids else "  (not plantable here: see demo.plant.plant_inconsistencies)"
                self.stdout.write(f"  {name}: {ids}{note}")

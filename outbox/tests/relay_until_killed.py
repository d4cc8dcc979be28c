"""A relay that stops between publish and mark: claims, publishes, reports, then waits to be killed.

Run as ``python -m outbox.tests.relay_until_killed LIMIT LEASE_SECONDS`` by test_crash.py, which SIGKILLs it.
"""

import os
import sys
import time

import django


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    django.setup()
    from outbox.claims import claim_due
    from outbox.publisher import Publisher

    limit, lease_seconds = int(sys.argv[1]), float(sys.argv[2])
    claim = claim_due(limit=limit, lease_seconds=lease_seconds)
    result = Publisher().publish(claim.messages)
    print(f"PUBLISHED {len(result.confirmed)} {len(result.failed)}", flush=True)
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main()

"""Place demo orders over the REST API with a progress bar, then watch their credits arrive."""

import argparse
import sys
import time
import uuid

import requests
from tqdm import tqdm


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    """Return the command line's options, read from `argv` (default: this process's arguments)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument(
        "--token",
        required=True,
        metavar="KEY",
        help="the API key; write --token=KEY, which reads a key made before keys began with cs_ even if it begins "
        "with '-'",
    )
    parser.add_argument("--orders", type=int, default=50)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for every credit")
    return parser.parse_args(argv)


def main() -> int:
    args = arguments()

    session = requests.Session()
    session.headers["Authorization"] = f"Token {args.token}"
    start_balance = session.get(f"{args.base_url}/api/credits/", timeout=10).json()["balance"]
    expected = 0
    for i in tqdm(range(args.orders), desc="placing orders", unit="order"):
        total = 1 + i % 5
        body = {"goods_name": f"demo item {i}", "total": total}
        key = str(uuid.uuid4())
        while True:
            response = session.post(
                f"{args.base_url}/api/orders/", json=body, headers={"Idempotency-Key": key}, timeout=10
            )
            if response.status_code != 429:
                break
            # Over the rate limit: wait as told and retry with the same key, so the order is placed exactly once.
            time.sleep(float(response.headers.get("Retry-After", 1)))
        if response.status_code != 201:
            print(f"order {i}: HTTP {response.status_code} {response.text[:200]}", file=sys.stderr)
            return 1
        expected += 2 * total

    deadline = time.monotonic() + args.timeout
    with tqdm(total=expected, desc="credits arriving", unit="credit") as bar:
        while True:
            gained = session.get(f"{args.base_url}/api/credits/", timeout=10).json()["balance"] - start_balance
            bar.update(gained - bar.n)
            if gained >= expected:
                break
            if time.monotonic() > deadline:
                print(f"only {gained} of {expected} credits arrived in {args.timeout:.0f}s", file=sys.stderr)
                return 1
            time.sleep(0.2)
    print(f"{args.orders} orders placed, {expected} credits awarded.")
    return 0


if __name__ == "__main__":
    sys.exit(main())

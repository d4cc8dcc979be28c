"""CPU of one API token look-up, in process: today's (DRF authtoken, plain key) against hashed tokens, ours and knox's.

Each arm authenticates a key N times through its TokenAuthentication.authenticate_credentials (the work a request
does for its `Authorization: Token <key>` header): `before`, the plain-text look-up of the checkout's base revision
(`git show REV:core/authentication.py`, default the merge of issue 19), `ours`, accounts/authentication.py (prefix,
HMAC-SHA256, constant-time compare), and `knox`, django-rest-knox's (prefix, SHA-512; no cache: it reads the
database on every request and also reads the user's other tokens to delete expired ones). Cached (the token row in
Redis, API_TOKEN_CACHE_SECONDS=30, warmed first) and uncached (API_TOKEN_CACHE_SECONDS=0, one query each) are
measured apart; knox has no cached path. The arms run interleaved in every round, their order rotating, and every
round is printed, then the median ratio against `before` of the same round.

CPU is time.process_time() of this process, plus what MariaDB (port 3306) and Redis (port 6379) spent meanwhile,
read from /proc (10 ms ticks: keep N * cost well above that). The machine is shared: read ratios, not absolutes.

    python bench/bench_auth.py [--rounds 7] [-n 2000] [--before-rev 57ad490]
"""

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, HostCpu, setup_django  # noqa: E402

USERNAME = "bench-auth"
BEFORE_REV = "57ad490"  # main after issue 19 (the front door): the plain-text token look-up this replaces


def load_before(rev: str):
    """Import core/authentication.py as it was at `rev`, under another name (it reads DRF's authtoken table)."""
    source = subprocess.run(
        ["git", "show", f"{rev}:core/authentication.py"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    path = Path(tempfile.mkdtemp(prefix="bench-auth-")) / "before_authentication.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("before_authentication", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_arms(before_rev: str) -> dict:
    """Return arm name -> a function authenticating its own key once."""
    from django.contrib.auth import get_user_model
    from django.utils import timezone
    from knox.auth import TokenAuthentication as KnoxAuthentication
    from knox.models import AuthToken
    from rest_framework.authtoken.models import Token

    from accounts.authentication import TokenAuthentication
    from accounts.services import api_token_create, api_tokens_revoke

    user = get_user_model().objects.get_or_create(username=USERNAME)[0]
    before = load_before(before_rev).TokenAuthentication()
    Token.objects.filter(user=user).delete()
    plain_key = Token.objects.create(user=user).key
    api_tokens_revoke(user=user)
    _, our_key = api_token_create(user=user, name="bench", expires_at=timezone.now() + timedelta(days=1))
    AuthToken.objects.filter(user=user).delete()
    _, knox_key = AuthToken.objects.create(user=user, expiry=timedelta(days=1))
    ours, knox = TokenAuthentication(), KnoxAuthentication()
    knox_bytes = knox_key.encode()  # knox's takes the header's bytes
    return {
        "before": lambda: before.authenticate_credentials(plain_key),
        "ours": lambda: ours.authenticate_credentials(our_key),
        "knox": lambda: knox.authenticate_credentials(knox_bytes),
    }


def measure(authenticate, n: int, host: HostCpu) -> dict[str, float]:
    """Return CPU microseconds per look-up: this process, mariadbd, redis-server and their sum."""
    authenticate()  # warm: the cache (when on) and the connection
    servers = host.snapshot()
    started = time.process_time()
    for _ in range(n):
        authenticate()
    own = time.process_time() - started
    costs = host.per_operation(servers, host.snapshot(), n)
    result = {"bench": own * 1e6 / n, **{name: costs[name] * 1000 for name in host.pids}}
    result["total"] = sum(result.values())
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("-n", type=int, default=2000, help="look-ups per arm and round")
    parser.add_argument(
        "--before-rev", default=BEFORE_REV, help="the revision whose core/authentication.py is 'before'"
    )
    args = parser.parse_args()

    setup_django(DJANGO_SETTINGS_MODULE="bench.auth_settings")
    from django.conf import settings

    arms = make_arms(args.before_rev)
    host = HostCpu()
    host.add_listener("mariadbd", 3306)
    host.add_listener("redis", 6379)
    paths = {"cached": 30, "uncached": 0}
    ratios = {(path, arm): [] for path in paths for arm in arms if arm != "before"}
    print(f"{args.n} look-ups per arm and round; CPU microseconds per look-up (bench process, mariadbd, redis, total)")
    for round_no in range(1, args.rounds + 1):
        for path, lifetime in paths.items():
            settings.API_TOKEN_CACHE_SECONDS = lifetime
            names = [name for name in arms if not (name == "knox" and lifetime)]  # knox has no cache
            names = names[round_no % len(names) :] + names[: round_no % len(names)]
            results = {name: measure(arms[name], args.n, host) for name in names}
            for name in names:
                r = results[name]
                print(
                    f"round {round_no} {path:8} {name:6}: bench {r['bench']:7.1f}  mariadbd {r['mariadbd']:6.1f}"
                    f"  redis {r['redis']:5.1f}  total {r['total']:7.1f} us",
                    flush=True,
                )
            for name in names:
                if name != "before":
                    ratios[(path, name)].append(results[name]["bench"] / results["before"]["bench"])
                    print(f"round {round_no} {path:8} {name}/before (bench process): {ratios[(path, name)][-1]:.2f}x")
    for (path, name), values in ratios.items():
        if values:
            print(
                f"{path} {name}/before, median of {len(values)} rounds: {statistics.median(values):.2f}x "
                f"(each: {', '.join(f'{v:.2f}' for v in values)})"
            )
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())} (2 cores, shared with other work)")


if __name__ == "__main__":
    main()

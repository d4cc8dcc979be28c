"""Silence is a fault too: a dependency's packets dropped both ways, no reset, while orders keep coming.

Each test puts one dependency behind a SilentLink (testkit/silence.py) for every process of a real cluster (gunicorn,
the relay loop, the outbox and credits workers, beat), keeps it silent for longer than every deadline that could hide
the fault, then heals it, and counts: how long each order request and each /healthz took, when work resumed after the
heal, and what was lost, credited twice or dead-lettered. The deadline a database silence must outlast is the relay's
and the workers' read (core/deadlines.py, 20 s in production): the cluster's processes get it shortened
(DATABASE_WORKER_READ_SECONDS), and the silence with it; the web's deadlines and the relay's lease are production's.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

import pytest
from django.conf import settings
from django.db import connections

from accounts.services import api_token_create
from core.cache import CACHE_FAIL_FAST_SECONDS
from core.deadlines import ROLES, WEB
from testkit.harness import Cluster
from testkit.load import HealthProbe, Ledger, OrderStream
from testkit.processes import database_address, database_url, free_port, service_env
from testkit.queues import purge_queues
from testkit.reconcile import wait_for_credits
from testkit.silence import SilentLink, iptables_available

# Not `alone`, but for Redis' test and the credits database's: the orders database's bounds are fixed waits (the
# web's 3 s read within 5 s, /healthz's 1.5 s check within 2 s) plus a little work, which held with room (1.9 s and
# 0.38 s at the least) while another cluster's test ran beside them.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not iptables_available(), reason="needs iptables and root (scripts/setup.sh)"),
]

# The relay's and the workers' database read deadline in the cluster (production's is 20 s: core/deadlines.py).
WORKER_READ_SECONDS = 5
# Past the longest deadline a silent database link could hide behind (that read), by as much as production's 25 s
# silence was past its 20 s.
SILENCE_SECONDS = WORKER_READ_SECONDS + 5
# Past Redis' socket timeout, the fail-fast cooldown after it (core/cache.py) and the next command's timeout.
REDIS_TIMEOUT_SECONDS = settings.CACHES["default"]["OPTIONS"]["socket_timeout"]
REDIS_SILENCE_SECONDS = REDIS_TIMEOUT_SECONDS + CACHE_FAIL_FAST_SECONDS + REDIS_TIMEOUT_SECONDS + 2
# Redis' test compares the rate of the warm-up's last 4 s with the silence's.
WARM_UP_SECONDS = 5
RATE = 30  # orders per second, across the clients
ANSWER_LIMIT_SECONDS = 5.0
HEALTHZ_LIMIT_SECONDS = 2.0
# For one read deadline after the orders database goes silent every web thread waits out the statement it was in
# (the breaker fails fast only after the first times out), and a probe sent then waits for a thread like any request.
ONSET_SECONDS = ROLES[WEB].read
FIRST_ORDER_AFTER_HEAL_LIMIT_SECONDS = 5.0
RESUME_LIMIT_SECONDS = 15.0
# Every acknowledged order credited after the heal, within: well inside the relay's lease (OUTBOX_LEASE_SECONDS, 60 s),
# which a claim whose COMMIT the silence left unanswered would hide its rows for, about 50 s past the heal, were it
# not given back (outbox/claims.py).
CATCH_UP_LIMIT_SECONDS = 30


@dataclass
class Silence:
    """What one silence did: when it began and healed, and what the clients and the health check saw."""

    ledger: Ledger
    probe: HealthProbe
    silent_at: float = 0.0
    healed_at: float = 0.0
    user_ids: list[int] = field(default_factory=list)
    # Seconds from the heal to the first credit awarded after it.
    credits_resumed: float | None = None

    def longest_request(self) -> float:
        return max(seconds for _, seconds, _ in self.ledger.requests)

    def slow_requests(self) -> list:
        return [r for r in self.ledger.requests if r[1] >= ANSWER_LIMIT_SECONDS]

    def unanswered_requests(self) -> list:
        """Attempts that got neither a 201 nor a 503 with Retry-After (counted by status or error)."""
        return [r for r in self.ledger.requests if r[2] not in (201, 503)]

    def longest_health_check(self, *, past_onset: bool = False) -> float:
        """Return the longest /healthz; past_onset: of those sent after the silence's first ONSET_SECONDS only."""
        onset = (self.silent_at, self.silent_at + ONSET_SECONDS) if past_onset else (0.0, 0.0)
        return max(seconds for at, seconds, _, _ in self.probe.answers if not onset[0] <= at - seconds < onset[1])

    def slowest_health_check(self) -> str:
        """Say when the slowest /healthz was sent, against the silence and the heal, and what it answered."""
        answered, seconds, status, body = max(self.probe.answers, key=lambda a: a[1])
        sent = answered - seconds
        return (
            f"sent {sent - self.silent_at:+.2f} s from the silence, {sent - self.healed_at:+.2f} s from the heal;"
            f" {status} {body.get('checks')}"
        )

    def first_order_after_heal(self) -> float:
        """Return the seconds from the heal to the first 201 after it (infinity: none came)."""
        answered = [at for at, _, status in self.ledger.requests if status == 201 and at > self.healed_at]
        return min(answered, default=float("inf")) - self.healed_at

    def after_heal(self) -> list:
        """Return the requests answered after the heal: (seconds after it, seconds taken, status)."""
        return [
            (round(at - self.healed_at, 2), round(s, 2), st)
            for at, s, st in self.ledger.requests
            if at > self.healed_at
        ]

    def orders_per_second(self, since: float, until: float) -> float:
        with self.ledger.lock:
            count = sum(1 for at, _, status in self.ledger.requests if status == 201 and since <= at < until)
        return count / (until - since)

    def report(self) -> str:
        statuses = dict(self.ledger.statuses)
        resumed = "never" if self.credits_resumed is None else f"{self.credits_resumed:.1f} s"
        return (
            f"statuses {statuses}; longest request {self.longest_request():.2f} s; longest /healthz"
            f" {self.longest_health_check():.2f} s ({self.slowest_health_check()}), past the onset"
            f" {self.longest_health_check(past_onset=True):.2f} s; first 201 {self.first_order_after_heal():.1f} s and"
            f" first credit {resumed} after the heal"
        )


@pytest.fixture
def cluster_through(transactional_db, tmp_path):
    """Return a function starting the cluster with some of its links (database aliases, "redis") through SilentLinks."""
    purge_queues()
    clusters: list[Cluster] = []
    links: list[SilentLink] = []

    def start(*through: str, **process_args) -> tuple[Cluster, SilentLink]:
        env = service_env(
            CACHE_KEY_PREFIX=f"silence-{free_port()}",
            DATABASE_WORKER_READ_SECONDS=str(WORKER_READ_SECONDS),
        )
        link = None
        for name in through:
            if name == "redis":
                link = SilentLink(("127.0.0.1", 6379))
                env["REDIS_URL"] = f"redis://127.0.0.1:{link.port}/0"
            else:
                link = SilentLink(database_address(name))
                env[{"default": "DATABASE_URL", "credits": "CREDITS_DATABASE_URL"}[name]] = database_url(
                    name, port=link.port
                )
            link.up()
            links.append(link)
        cluster = Cluster(service_env=env, workdir=tmp_path, port=free_port(), process_args=process_args)
        clusters.append(cluster)
        cluster.start("web", "relay", "outbox", "credits", "beat")
        return cluster, link

    yield start
    for link in links:
        link.down()
    for cluster in clusters:
        cluster.stop()
    purge_queues()


def users_with_tokens(make_user, count: int, prefix: str) -> tuple[list[int], list[str]]:
    users = [make_user(f"{prefix}{i}") for i in range(count)]
    return [u.pk for u in users], [api_token_create(user=u)[1] for u in users]


def silence_under_orders(
    cluster: Cluster,
    link: SilentLink,
    tokens: list[str],
    user_ids: list[int],
    *,
    seconds: float = SILENCE_SECONDS,
    rate: float = RATE,
) -> Silence:
    """Place orders steadily, keep `link` silent for `seconds` in the middle, and watch when credits resume."""
    ledger = Ledger()
    stream = OrderStream(cluster.base_url, tokens, rate=rate, ledger=ledger)
    probe = HealthProbe(cluster.base_url)
    silence = Silence(ledger=ledger, probe=probe, user_ids=user_ids)
    stream.start()
    probe.start()
    try:
        time.sleep(WARM_UP_SECONDS)
        silence.silent_at = time.monotonic()
        with link.silenced():
            time.sleep(seconds)
        silence.healed_at = time.monotonic()
        credited_at_heal = credits_count(user_ids)
        # Orders keep coming after the heal; the first credit after it shows the relay and a consumer work again.
        deadline = silence.healed_at + CATCH_UP_LIMIT_SECONDS
        while silence.credits_resumed is None and time.monotonic() < deadline:
            if credits_count(user_ids) > credited_at_heal:
                silence.credits_resumed = time.monotonic() - silence.healed_at
            time.sleep(0.2)
        # Orders go on past the limit the first one after the heal is held to.
        time.sleep(max(0.0, silence.healed_at + FIRST_ORDER_AFTER_HEAL_LIMIT_SECONDS + 1 - time.monotonic()))
    finally:
        stream.stop()
        probe.stop()
    print(silence.report())
    return silence


def credits_count(user_ids: list[int]) -> int:
    placeholders = ",".join(["%s"] * len(user_ids))
    with connections["credits"].cursor() as cursor:
        cursor.execute(f"SELECT COUNT(*) FROM order_credits WHERE user_id IN ({placeholders})", user_ids)  # noqa: S608
        return cursor.fetchone()[0]


def assert_nothing_lost_duplicated_or_dead(silence: Silence, user_ids: list[int], cluster: Cluster) -> None:
    result, _ = wait_for_credits(silence.ledger, user_ids, timeout=CATCH_UP_LIMIT_SECONDS)
    logs = "\n".join(cluster.logs(name, tail=30) for name in ("web", "relay", "credits", "outbox"))
    result.assert_nothing_lost_or_duplicated(logs=logs)
    assert result.dead_letters == 0, logs
    # No process exited (the harness restarts one that does, as systemd would, and counts it).
    assert not cluster.restarts, f"{dict(cluster.restarts)}\n{logs}"


def test_the_orders_database_silent_every_request_is_answered_in_time_and_orders_resume_after_the_heal(
    cluster_through, make_user
):
    user_ids, tokens = users_with_tokens(make_user, 6, "silent-orders")
    cluster, link = cluster_through("default")

    silence = silence_under_orders(cluster, link, tokens, user_ids)

    assert not silence.slow_requests(), silence.report()
    assert not silence.unanswered_requests(), silence.report()
    during = [a for a in silence.probe.answers if silence.silent_at + 4 < a[0] < silence.healed_at]
    assert during and all(status == 503 and body["checks"]["database"] != "ok" for _, _, status, body in during)
    # Every probe is answered, as 200 or 503 with its JSON body: one sent just before the silence too.
    assert all(status in (200, 503) for _, _, status, _ in silence.probe.answers), silence.report()
    assert silence.longest_health_check() < ANSWER_LIMIT_SECONDS, silence.report()
    assert silence.longest_health_check(past_onset=True) < HEALTHZ_LIMIT_SECONDS, silence.report()
    assert silence.first_order_after_heal() < FIRST_ORDER_AFTER_HEAL_LIMIT_SECONDS, (
        f"{silence.after_heal()[:40]}\n{cluster.logs('web', tail=60)}"
    )
    assert silence.credits_resumed is not None and silence.credits_resumed < RESUME_LIMIT_SECONDS, silence.report()
    assert_nothing_lost_duplicated_or_dead(silence, user_ids, cluster)


# Alone: its one failure so far (docs/RELIABILITY.md, "Open") came with other workers loading the cores.
@pytest.mark.alone
def test_the_credits_database_silent_orders_flow_and_the_consumers_resume_within_seconds_of_the_heal(
    cluster_through, make_user
):
    user_ids, tokens = users_with_tokens(make_user, 4, "silent-credits")
    cluster, link = cluster_through("credits")

    silence = silence_under_orders(cluster, link, tokens, user_ids)

    # The order service does not need the credits database to take an order.
    assert set(silence.ledger.statuses) == {201}, silence.report()
    assert silence.longest_request() < ANSWER_LIMIT_SECONDS
    assert silence.longest_health_check() < HEALTHZ_LIMIT_SECONDS
    assert all(status == 200 for _, _, status, _ in silence.probe.answers)
    during = [body for at, _, _, body in silence.probe.answers if silence.silent_at + 4 < at < silence.healed_at]
    assert during and all(body["checks"]["credits_database"] != "ok" for body in during)  # named, informational
    assert silence.credits_resumed is not None and silence.credits_resumed < RESUME_LIMIT_SECONDS, cluster.logs(
        "credits", tail=60
    )
    credits_log = (cluster.workdir / "logs" / "credits.log").read_text(errors="replace")
    # The outage path hands a message back without spending its retries.
    assert not re.findall(r"failed \(\w+\), retry", credits_log), credits_log[-3000:]
    assert_nothing_lost_duplicated_or_dead(silence, user_ids, cluster)


# The rate before the silence against the rate during it: another worker's load changing between the two would
# change it.
@pytest.mark.alone
def test_redis_silent_orders_keep_more_than_half_their_rate(cluster_through, make_user):
    user_ids, tokens = users_with_tokens(make_user, 4, "silent-redis")
    cluster, link = cluster_through("redis")
    # As fast as the clients can: the rate the service sustains is what is compared.
    silence = silence_under_orders(cluster, link, tokens, user_ids, seconds=REDIS_SILENCE_SECONDS, rate=10_000)

    before = silence.orders_per_second(silence.silent_at - 4, silence.silent_at)
    during = silence.orders_per_second(silence.silent_at + 1, silence.healed_at)
    print(f"orders/s before {before:.0f}, while Redis was silent {during:.0f}")
    assert during >= 0.5 * before, silence.report()
    assert set(silence.ledger.statuses) == {201}, silence.report()
    assert silence.longest_request() < ANSWER_LIMIT_SECONDS
    assert all(status == 200 for _, _, status, _ in silence.probe.answers)
    assert silence.credits_resumed is not None and silence.credits_resumed < RESUME_LIMIT_SECONDS, silence.report()
    assert_nothing_lost_duplicated_or_dead(silence, user_ids, cluster)

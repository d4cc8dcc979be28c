"""The relay loop's doorbell in Redis: a list a live ``relay_outbox`` loop waits on, rung by the web after a commit.

A wake-up sent as an ``outbox.relay`` Celery task costs the broker a message and a worker a task (about 0.9 ms of
worker CPU and 0.3 ms of RabbitMQ's per wake-up, 40 a second under load: bench_orders.py). While a dedicated relay
loop runs, it does the same drain for the price of one Redis command on each side:
- the loop keeps a heartbeat key alive (HEARTBEAT_TTL_SECONDS, refreshed at least every HEARTBEAT_REFRESH_SECONDS)
  and waits on the bell list with BLPOP between drains;
- the web's wake-up thread runs one script (``ring``): take the wake-up gate (the same SET NX PX key and interval as
  before, so old and new web processes share one interval), and if the heartbeat is there, push onto the bell list
  (kept at one entry) instead of sending a task. No heartbeat (no loop, an older relay, a loop stopped or dead for
  longer than the TTL) means a Celery task as before.

Under sustained load the gate is taken for longer. Each ring also reports the commits its process made since its
last one, counted per second of the Redis server's clock (RATE_KEY); when the web tier committed at least
OUTBOX_WAKE_BUSY_RATE orders in the previous second, the gate is taken for OUTBOX_WAKE_BUSY_INTERVAL_SECONDS instead
of OUTBOX_WAKE_INTERVAL_SECONDS. Every drain then carries a tenth of a second's orders rather than a fortieth, so the
relay, the broker and the consumers work per batch: in bench_orders.py the whole host's CPU per order is about a
tenth lower with the gate at 100 ms than at 25 ms (docs/PERFORMANCE.md). A quiet stream or
a single burst keeps the short gate and its latency. Web processes of an older release ring with their own script
and report nothing: the count only misses their commits.

A loop killed without stopping leaves its heartbeat for up to the TTL; the wake-ups rung in that window wait in the
list for the next loop, and the beat sweeper relays their rows meanwhile. A loop that stops on its signal deletes
its heartbeat first, so the web turns to tasks at once. Keys carry the cache's key prefix, so deployments sharing a
Redis do not ring each other's relays. The script's keys must live on one Redis node (no Redis Cluster slots).
"""

import enum
import logging
import threading
import time
import uuid

import redis
from django.core.cache import caches
from redis.commands.core import Script
from redis.exceptions import RedisError

from core.cache import shared_client
from outbox.outage import OutageLog

logger = logging.getLogger(__name__)

GATE_KEY = "outbox:wake-gate"
HEARTBEAT_KEY = "outbox:relay-listening"
BELL_KEY = "outbox:relay-bell"
# A hash: the current second of the Redis clock ("second"), the commits reported in it ("count"), and the count of the
# second before it ("previous") when that was the one just before.
RATE_KEY = "outbox:wake-rate"
RATE_TTL_MS = 5000
HEARTBEAT_TTL_SECONDS = 5.0
HEARTBEAT_REFRESH_SECONDS = 1.0
# A loop waits on the bell this long at a time, so it sees its stop signal within that (docs/OPERATIONS.md).
LISTEN_SLICE_SECONDS = 0.5
# BLPOP's timeout 0 means forever; anything shorter than this is waited out without Redis.
LISTEN_MIN_SECONDS = 0.01


class Ring(enum.IntEnum):
    """What ringing did: nothing (another process rang or sent within the interval), a task is needed, or rung."""

    GATED = 0
    NO_LISTENER = 1
    RUNG = 2


# KEYS: gate, heartbeat, bell, rate; ARGV: the interval in ms (0: no gate), the bell's expiry in ms, the commits to
# report, the busy rate (commits in the previous second; 0: never busy), the busy interval in ms, the rate's expiry.
# Returns {what ringing did (Ring), in ms: the interval of the gate it took, or what remains of the one it found}.
RING_SCRIPT = Script(
    None,
    b"""
local now = tonumber(redis.call('TIME')[1])
local second = tonumber(redis.call('HGET', KEYS[4], 'second') or -1)
if second ~= now then
  local previous = 0
  if second == now - 1 then previous = tonumber(redis.call('HGET', KEYS[4], 'count') or 0) end
  redis.call('HSET', KEYS[4], 'second', now, 'count', 0, 'previous', previous)
end
redis.call('HINCRBY', KEYS[4], 'count', ARGV[3])
redis.call('PEXPIRE', KEYS[4], ARGV[6])
local gate = tonumber(ARGV[1])
local busy = tonumber(ARGV[4])
if gate > 0 and busy > 0 and tonumber(redis.call('HGET', KEYS[4], 'previous')) >= busy then gate = tonumber(ARGV[5]) end
if gate > 0 and not redis.call('SET', KEYS[1], 1, 'NX', 'PX', gate) then
  return {0, math.max(redis.call('PTTL', KEYS[1]), 1)}
end
if redis.call('EXISTS', KEYS[2]) == 0 then return {1, gate} end
redis.call('LPUSH', KEYS[3], 1)
redis.call('LTRIM', KEYS[3], 0, 0)
redis.call('PEXPIRE', KEYS[3], ARGV[2])
return {2, gate}
""",
)
# KEYS: heartbeat; ARGV: this listener's token. Deletes the heartbeat only if no other loop refreshed it since.
FORGET_SCRIPT = Script(None, b"if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end")


def _keys(cache) -> list[str]:
    return [cache.make_and_validate_key(key) for key in (GATE_KEY, HEARTBEAT_KEY, BELL_KEY, RATE_KEY)]


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000)) if seconds > 0 else 0


def ring(*, interval: float, commits: int = 0, busy_rate: int = 0, busy_interval: float = 0.0) -> tuple[Ring, float]:
    """Take the wake-up gate and, if a relay loop listens, ring its bell; one round trip. Raises RedisError.

    `commits` (made since this process last rang) count toward the web tier's rate; when the tier committed at least
    `busy_rate` in the previous second, the gate is taken for `busy_interval` instead of `interval`. Return what
    ringing did and, in seconds, the interval of the gate it took or what remains of the one it found.
    """
    cache = caches["default"]
    client = shared_client(cache, write=True)
    args = [_ms(interval), _ms(HEARTBEAT_TTL_SECONDS), commits, busy_rate, _ms(busy_interval), RATE_TTL_MS]
    outcome, gate_ms = RING_SCRIPT(keys=_keys(cache), args=args, client=client)
    return Ring(outcome), gate_ms / 1000


class Listener:
    """The loop's side: keep the heartbeat alive while waiting on the bell; wait on a plain timer when Redis is down.

    ``live`` says whether the last wait heard Redis (the web rings then, so the loop need not poll often).
    """

    def __init__(self):
        cache = caches["default"]
        _, self.heartbeat_key, self.bell_key, _ = _keys(cache)
        # Its own client: the cache's socket timeout (1 s) is shorter than a wait may be.
        self._client = redis.Redis.from_url(
            cache._cache._servers[0],
            socket_connect_timeout=0.5,
            socket_timeout=LISTEN_SLICE_SECONDS + 2.0,
        )
        self._token = uuid.uuid4().hex
        self._beat_at = -HEARTBEAT_REFRESH_SECONDS
        self._outage = OutageLog("redis (relay bell)", log=logger)
        self.live = False

    def wait(self, timeout: float, stop: threading.Event) -> bool:
        """Wait up to `timeout` seconds for the bell or `stop`; return whether the bell rang."""
        deadline = time.monotonic() + timeout
        while not stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining < LISTEN_MIN_SECONDS:
                stop.wait(max(remaining, 0.0))
                return False
            try:
                self._beat()
                rung = self._client.blpop([self.bell_key], timeout=min(remaining, LISTEN_SLICE_SECONDS))
            except RedisError as exc:
                self.live = False
                self._beat_at = -HEARTBEAT_REFRESH_SECONDS
                self._outage.failed(exc)
                stop.wait(max(deadline - time.monotonic(), 0.0))
                return False
            self.live = True
            self._outage.recovered()
            if rung:
                return True
        return False

    def _beat(self) -> None:
        now = time.monotonic()
        if now - self._beat_at >= HEARTBEAT_REFRESH_SECONDS:
            self._client.set(self.heartbeat_key, self._token, px=round(HEARTBEAT_TTL_SECONDS * 1000))
            self._beat_at = now

    def close(self) -> None:
        """Take the heartbeat down (unless another loop refreshed it since), so the web sends tasks at once."""
        try:
            FORGET_SCRIPT(keys=[self.heartbeat_key], args=[self._token], client=self._client)
        except RedisError as exc:
            logger.warning("relay heartbeat left to expire (%.0f s): %s", HEARTBEAT_TTL_SECONDS, exc)
        finally:
            self._client.close()
            self.live = False

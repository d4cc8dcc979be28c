"""Same-key pairs through the service on two Galera nodes, judged by the rows every node holds.

An order pair is one Idempotency-Key sent to two web hosts at once, each writing to its own node over a kept-alive
connection, a 503 retried with the same key as the API asks. An award pair is one award taken by two consumers at
once, each on its own node, a refusal (1213) retried as the consumer retries it. Certification refuses one side of
most pairs; what each side was told is then checked against what is stored on every node.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import requests
from django.db import OperationalError, connections

from credits.services import credit_award
from testkit.galera_cluster import NODES, GaleraCluster

ER_LOCK_DEADLOCK = 1213
RETRY_SECONDS = 0.05  # a client that waits out Retry-After would only slow the test down
ANSWER_SECONDS = 30  # every request answers well within this unless a node is gone


@dataclass
class Pairs:
    """What a run of pairs met: each side's first answer, and per pair the answers it ended with."""

    first_answers: Counter = field(default_factory=Counter)
    final: list = field(default_factory=list)
    seconds: float = 0.0

    @property
    def conflicts(self) -> int:
        return self.first_answers["503"] + self.first_answers[str(ER_LOCK_DEADLOCK)]

    def __str__(self) -> str:
        return f"{len(self.final)} pairs in {self.seconds:.0f} s; first answers {dict(self.first_answers)}"


def run_pairs(sides: list[Callable[[str], tuple[str, object]]], *, pairs: int, until_conflicts: int) -> Pairs:
    """Send each of `pairs` new keys through both sides at once; stop early once `until_conflicts` first answers were
    refusals. A side takes the key and returns (its first answer, its final answer); each side runs on a thread of its
    own for the whole run, so it keeps its connections."""
    start = threading.Barrier(len(sides) + 1, timeout=2 * ANSWER_SECONDS)
    end = threading.Barrier(len(sides) + 1, timeout=2 * ANSWER_SECONDS)
    current: dict = {"key": None}
    answers: list = [None] * len(sides)
    failures: list = []

    def side(number: int) -> None:
        try:
            while True:
                start.wait()
                if current["key"] is None:
                    return
                try:
                    answers[number] = sides[number](current["key"])
                except Exception as error:  # reported by the main thread, which fails the test
                    failures.append(error)
                end.wait()
        finally:
            connections.close_all()

    threads = [threading.Thread(target=side, args=(number,), daemon=True) for number in range(len(sides))]
    for thread in threads:
        thread.start()
    outcome = Pairs()
    started = time.monotonic()
    try:
        for _ in range(pairs):
            current["key"] = uuid.uuid4().hex
            answers[:] = [None] * len(sides)
            start.wait()
            end.wait()
            if failures:
                raise AssertionError(f"a side failed on key {current['key']}") from failures[0]
            outcome.first_answers.update(first for first, _ in answers)
            outcome.final.append((current["key"], [final for _, final in answers]))
            if outcome.conflicts >= until_conflicts:
                break
    finally:
        current["key"] = None
        start.wait()
        for thread in threads:
            thread.join(timeout=ANSWER_SECONDS)
    outcome.seconds = time.monotonic() - started
    return outcome


def order_side(base_url: str, token: str) -> Callable[[str], tuple[str, object]]:
    """A client of one web host on a kept-alive connection: its final answer is (status, order id, replayed)."""
    session = requests.Session()
    session.headers["Authorization"] = f"Token {token}"

    def send(key: str) -> tuple[str, object]:
        first = None
        deadline = time.monotonic() + ANSWER_SECONDS
        while True:
            response = session.post(
                f"{base_url}/api/orders/",
                json={"goods_name": "pair", "total": 3},
                headers={"Idempotency-Key": key},
                timeout=ANSWER_SECONDS,
            )
            first = first or str(response.status_code)
            if response.status_code != 503 or time.monotonic() > deadline:
                break
            time.sleep(RETRY_SECONDS)
        body = response.json() if response.status_code in (200, 201) else response.text
        replayed = response.headers.get("Idempotent-Replayed") == "true"
        return first, (response.status_code, body["id"] if isinstance(body, dict) else body, replayed)

    return send


def award_side(address: tuple[str, int], user_id: int, total: int) -> Callable[[str], tuple[str, object]]:
    """A consumer awarding on its own connection to one node, retrying a refusal as the consumer does: its final
    answer is `created`. The key names the order (an int in the key's last 12 hex digits)."""

    def send(key: str) -> tuple[str, object]:
        connection = connections["credits"]
        if (connection.settings_dict["HOST"], connection.settings_dict["PORT"]) != (address[0], str(address[1])):
            connection.close()
            connection.settings_dict = {**connection.settings_dict, "HOST": address[0], "PORT": str(address[1])}
        award = {"transaction_id": key, "order_id": int(key[-12:], 16), "user_id": user_id, "total": total}
        first = None
        deadline = time.monotonic() + ANSWER_SECONDS
        while True:
            try:
                created = credit_award(**award).created
                return first or "ok", created
            except OperationalError as refused:
                first = first or str(refused.args[0])
                if refused.args[0] != ER_LOCK_DEADLOCK or time.monotonic() > deadline:
                    return first, str(refused.args[0])
                time.sleep(RETRY_SECONDS)

    return send


def on_each_node(cluster: GaleraCluster, alias: str, sql: str, parameters: tuple) -> dict[int, list[tuple]]:
    """Return what `sql` reads on each node directly, after the node applied every write committed before."""
    database = connections[alias].settings_dict["NAME"]
    rows = {}
    for node in NODES:
        connection = cluster.connect(node, database=database, timeout=ANSWER_SECONDS)
        try:
            cursor = connection.cursor()
            cursor.execute("SET SESSION wsrep_sync_wait = 1")
            cursor.execute(sql, parameters)
            rows[node] = sorted(cursor.fetchall())
        finally:
            connection.close()
    return rows


def same_on_each_node(cluster: GaleraCluster, alias: str, sql: str, parameters: tuple) -> list[tuple]:
    """Return the rows `sql` reads, failing when two nodes disagree."""
    rows = on_each_node(cluster, alias, sql, parameters)
    assert all(found == rows[NODES[0]] for found in rows.values()), f"the nodes disagree: {rows}"
    return rows[NODES[0]]


def order_pairs_judged(cluster: GaleraCluster, user_id: int, outcome: Pairs) -> list[str]:
    """Return what is wrong with the order pairs, judged by the rows on every node: each acknowledged order stored,
    one order per key with its outbox row, both answers of a pair naming it."""
    wrong = []
    keys = dict(
        same_on_each_node(
            cluster, "default", "SELECT `key`, order_id FROM idempotency_keys WHERE user_id = %s", (user_id,)
        )
    )
    order_ids = [
        order_id
        for (order_id,) in same_on_each_node(cluster, "default", "SELECT id FROM orders WHERE user_id = %s", (user_id,))
    ]
    placeholders = ", ".join(["%s"] * len(order_ids)) or "NULL"
    logs = dict(
        same_on_each_node(
            cluster,
            "default",
            f"SELECT foreign_key, COUNT(*) FROM transaction_log WHERE foreign_key IN ({placeholders}) GROUP BY 1",  # noqa: S608
            tuple(str(order_id) for order_id in order_ids),
        )
    )
    orders = {order_id: logs.get(str(order_id), 0) for order_id in order_ids}
    for key, answers in outcome.final:
        named = {order_id for status, order_id, _ in answers if status in (200, 201)}
        if any(status not in (200, 201) for status, _, _ in answers):
            wrong.append(f"key {key}: answers {answers}")
        if len(named) > 1:
            wrong.append(f"key {key}: the pair was told of two orders {sorted(named)}")
        missing = named - set(orders)
        if missing:
            wrong.append(f"key {key}: acknowledged order(s) {sorted(missing)} stored on no node")
        if keys.get(key) not in named:
            wrong.append(f"key {key}: its stored order {keys.get(key)} is not the one answered ({sorted(named)})")
        if sum(1 for _, _, replayed in answers if not replayed) != 1:
            wrong.append(f"key {key}: {answers} does not create exactly once")
    if len(orders) != len(outcome.final):
        wrong.append(f"{len(orders)} orders stored for {len(outcome.final)} keys")
    if unlogged := [order_id for order_id, logs in orders.items() if logs != 1]:
        wrong.append(f"orders without exactly one outbox row: {unlogged[:20]}")
    return wrong


def award_pairs_judged(cluster: GaleraCluster, user_id: int, total: int, outcome: Pairs) -> list[str]:
    """Return what is wrong with the award pairs, judged by the rows on every node: one credit per order, `created`
    told once per order and only where the credit is stored, the balance the sum of the credits."""
    wrong = []
    credits = dict(
        same_on_each_node(
            cluster,
            "credits",
            "SELECT transaction_id, COUNT(*) FROM order_credits WHERE user_id = %s GROUP BY 1",
            (user_id,),
        )
    )
    balance = same_on_each_node(
        cluster, "credits", "SELECT balance FROM credit_balances WHERE user_id = %s", (user_id,)
    )
    for key, answers in outcome.final:
        if sorted(answers, key=str) != [False, True]:
            wrong.append(f"award {key}: answered {answers}")
        if credits.get(key) != 1:
            wrong.append(f"award {key}: {credits.get(key, 0)} credit rows (answered {answers})")
    due = 2 * total * sum(credits.values())
    if balance != [(due,)]:
        wrong.append(f"balance {balance}, the credits stored sum to {due}")
    return wrong

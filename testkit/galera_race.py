"""Two transactions on two Galera nodes writing the same unique key, at the driver level: what each client was told
against what the cluster stored.

Each side runs ``START TRANSACTION``, an INSERT of the shared key (its own mark in the row), an INSERT of its own mark
into a second table, and ``COMMIT``, in one of three forms: the whole as one multi-statement batch (`BATCH`, COMMIT
inside), the batch with COMMIT sent alone afterwards (`COMMIT_APART`), or one statement per round trip (`ROUND_TRIPS`,
core/sql.Transaction.round_trips, what the service sends to a Galera node). Both sides are let go together (a
barrier), so certification nearly always refuses one of them. Each side is then judged by its rows, read on every
node: acknowledged with nothing stored (a phantom), one of its two rows stored (a partial commit), or refused with its
rows stored (a lost error). docs/OPERATIONS.md, "A Galera cluster", gives the figures and the command:

    python -m testkit.galera_race HOST:PORT HOST:PORT [PAIRS]
"""

from __future__ import annotations

import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

import MySQLdb
from MySQLdb.constants import CLIENT

from core.sql import Transaction
from testkit.galera_cluster import root_connection

BATCH, COMMIT_APART, ROUND_TRIPS = "batch", "commit apart", "round trips"
FORMS = (BATCH, COMMIT_APART, ROUND_TRIPS)
ER_LOCK_DEADLOCK = 1213
ER_DUP_ENTRY = 1062
DATABASE = "creditshop_galera_race"
KEYS, MARKS = "race_keys", "race_marks"
DEADLINE = 10  # seconds: every statement here answers in milliseconds unless a node is gone


def connect(address: tuple[str, int], database: str = DATABASE) -> MySQLdb.Connection:
    return root_connection(address, database, DEADLINE, client_flag=CLIENT.MULTI_STATEMENTS)


def tables_create(address: tuple[str, int]) -> None:
    """Create the race's database and empty tables (replicated to every node)."""
    connection = connect(address, database="")
    try:
        cursor = connection.cursor()
        cursor.execute(f"CREATE DATABASE IF NOT EXISTS {DATABASE}")
        for table in (KEYS, MARKS):
            cursor.execute(f"DROP TABLE IF EXISTS {DATABASE}.{table}")
        cursor.execute(f"CREATE TABLE {DATABASE}.{KEYS} (k CHAR(32) PRIMARY KEY, mark BIGINT NOT NULL) ENGINE=InnoDB")
        cursor.execute(f"CREATE TABLE {DATABASE}.{MARKS} (mark BIGINT PRIMARY KEY) ENGINE=InnoDB")
    finally:
        connection.close()


def statements(key: str, mark: int, *, pause: float = 0) -> tuple[str, ...]:
    """Return one side's statements: the shared key first, so the conflict's lock is taken before the other INSERT;
    with `pause`, a sleep between the two on the server, widening the moment between them."""
    between = (f"DO SLEEP({pause})",) if pause else ()
    return (f"INSERT INTO {KEYS} (k, mark) VALUES ('{key}', {mark})", *between, f"INSERT INTO {MARKS} VALUES ({mark})")


def transaction_run(connection: MySQLdb.Connection, form: str, body: tuple[str, ...], *, idle: float = 0) -> None:
    """Run the transaction in `form`, reading every result; `idle` seconds between round trips (ROUND_TRIPS only).
    An error propagates with the transaction rolled back."""
    transaction = Transaction(body)
    trips = {
        BATCH: (transaction.sql,),
        COMMIT_APART: (Transaction(body, commits=False).sql, "COMMIT"),
        ROUND_TRIPS: transaction.round_trips,
    }[form]
    try:
        for number, trip in enumerate(trips):
            if number and idle:
                time.sleep(idle)
            connection.query(trip)
            while connection.next_result() == 0:
                pass
    except MySQLdb.Error:
        try:
            connection.query("ROLLBACK")
        except MySQLdb.Error:
            connection.close()
        raise


@dataclass
class Outcomes:
    """What the pairs met: per side, what it was told against what was stored."""

    form: str
    pairs: int = 0
    conflicts: int = 0  # pairs where one side was refused by certification (1213)
    answers: Counter = field(default_factory=Counter)  # "ok", or the error code
    phantoms: list = field(default_factory=list)  # (pair, side): acknowledged, nothing stored
    partials: list = field(default_factory=list)  # (pair, side): one of its two rows stored
    lost_errors: list = field(default_factory=list)  # (pair, side): refused, yet stored
    seconds: float = 0.0

    @property
    def wrong(self) -> int:
        return len(self.phantoms) + len(self.partials) + len(self.lost_errors)

    def __str__(self) -> str:
        return (
            f"{self.form}: {self.pairs} pairs in {self.seconds:.0f} s, {self.conflicts} refused by certification;"
            f" answers {dict(self.answers)}; phantoms {len(self.phantoms)}, partial commits {len(self.partials)},"
            f" lost errors {len(self.lost_errors)}"
        )


def stored(checks: list[MySQLdb.Connection], key: str, mark: int) -> tuple[int, int]:
    """Return (key rows with this mark, mark rows) as every node holds them; a node that disagrees fails the run."""
    seen = set()
    for check in checks:
        cursor = check.cursor()
        cursor.execute(
            f"SELECT (SELECT COUNT(*) FROM {KEYS} WHERE k = %s AND mark = %s), (SELECT COUNT(*) FROM {MARKS} WHERE"  # noqa: S608
            " mark = %s)",
            (key, mark, mark),
        )
        seen.add(tuple(cursor.fetchone()))
    if len(seen) != 1:
        raise AssertionError(f"the nodes disagree on key {key}, mark {mark}: {seen}")
    return seen.pop()


def race(
    nodes: list[tuple[str, int]],
    form: str,
    *,
    pairs: int,
    until_wrong: bool = False,
    until_conflicts: int | None = None,
) -> Outcomes:
    """Race `pairs` same-key pairs, one side on each of the first two nodes, judged on every node; stop early at the
    first wrong answer (`until_wrong`) or once `until_conflicts` pairs were refused by certification."""
    sides = [connect(nodes[0]), connect(nodes[1])]
    checks = [connect(node) for node in nodes]
    for check in checks:
        check.query("SET SESSION wsrep_sync_wait = 1")  # reads see every write the cluster committed before them
    together = threading.Barrier(2, timeout=DEADLINE)
    answers: list = [None, None]
    outcomes = Outcomes(form)
    marks = iter(range(int(time.time() * 1000) * 10, 2**62))

    def side(number: int, body: tuple[str, ...]) -> None:
        try:
            together.wait()
            transaction_run(sides[number], form, body)
            answers[number] = "ok"
        except MySQLdb.Error as error:
            answers[number] = error.args[0]
            if not sides[number].open:
                sides[number] = connect(nodes[number])

    started = time.monotonic()
    try:
        for pair in range(pairs):
            key, own = uuid.uuid4().hex, (next(marks), next(marks))
            threads = [threading.Thread(target=side, args=(n, statements(key, own[n]))) for n in (0, 1)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            outcomes.pairs += 1
            outcomes.answers.update(answers)
            outcomes.conflicts += ER_LOCK_DEADLOCK in answers
            for number in (0, 1):
                key_rows, mark_rows = stored(checks, key, own[number])
                if key_rows != mark_rows:
                    outcomes.partials.append((pair, number))
                elif answers[number] == "ok" and not key_rows:
                    outcomes.phantoms.append((pair, number))
                elif answers[number] != "ok" and key_rows:
                    outcomes.lost_errors.append((pair, number))
            if until_wrong and outcomes.wrong:
                break
            if until_conflicts is not None and outcomes.conflicts >= until_conflicts:
                break
    finally:
        for connection in sides + checks:
            connection.close()
    outcomes.seconds = time.monotonic() - started
    return outcomes


def widened(nodes: list[tuple[str, int]], form: str, *, pause: float = 1.0) -> tuple[object, tuple[int, int]]:
    """Make the other node's write set arrive between the two INSERTs of one side, every time: that side pauses there
    (on the server inside a batch, between round trips for ROUND_TRIPS) while the other side inserts the key on
    another node. Return what the pausing side was told, and its (key rows, mark rows) as every node holds them."""
    ours, theirs = connect(nodes[0]), connect(nodes[1])
    checks = [connect(node) for node in nodes]
    key, mark = uuid.uuid4().hex, int(time.time() * 1000) * 10
    answer: list = []

    def pausing() -> None:
        try:
            if form == ROUND_TRIPS:
                transaction_run(ours, form, statements(key, mark), idle=pause)
            else:
                transaction_run(ours, form, statements(key, mark, pause=pause))
            answer.append("ok")
        except MySQLdb.Error as error:
            answer.append(error.args[0])

    try:
        thread = threading.Thread(target=pausing)
        thread.start()
        time.sleep(pause / 4)  # the first INSERT has run; the pause has begun
        theirs.query(f"INSERT INTO {KEYS} (k, mark) VALUES ('{key}', {mark + 1})")
        thread.join(timeout=DEADLINE + pause)
        for check in checks:
            check.query("SET SESSION wsrep_sync_wait = 1")
        rows = stored(checks, key, mark)
    finally:
        for connection in [ours, theirs, *checks]:
            connection.close()
    return answer[0], rows


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


if __name__ == "__main__":
    first, second, *rest = sys.argv[1:]
    addresses = [_address(first), _address(second)]
    count = int(rest[0]) if rest else 3000
    tables_create(addresses[0])
    for name in FORMS:
        print(race(addresses, name, pairs=count), flush=True)

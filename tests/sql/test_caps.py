"""Concurrency caps inside claim (sql/caps.sql, sql/fair.sql, sql/claim.sql): max_active_per_group, max_active
and kind_limits, held under many concurrent claimers (a checker connection samples the active jobs all along),
with expired leases reclaimed, on fair queues and on plain-order ones."""

from __future__ import annotations

import collections
import random
import threading
import time
from typing import Any

import psycopg
import pytest
from conftest import ConnectFactory

from tests.helpers.foundation import call, claim, expire, raises_pj, run_threads

Conn = psycopg.Connection[Any]


def put(conn: Conn, group: str | None, n: int, queue: str = "q", kind: str = "k") -> list[int]:
    jobs = [{"kind": kind, "queue": queue, "group_key": group} for _ in range(n)]
    return [r["id"] for r in call(conn, "enqueue_many", jobs=jobs)]


def complete(conn: Conn, rows: list[dict[str, Any]]) -> None:
    if rows:
        call(conn, "complete_many", ids=[r["id"] for r in rows], lease_tokens=[r["lease_token"] for r in rows])


def active(conn: Conn, queue: str = "q") -> dict[str | None, int]:
    rows = conn.execute(
        "SELECT group_key, count(*) FROM pgjobs.jobs WHERE queue = %s AND state = 'active' GROUP BY group_key",
        [queue],
    ).fetchall()
    return {g: int(n) for g, n in rows}


class Checker:
    """A connection of its own that samples the active jobs per group and per queue, as fast as it can, and
    keeps the maxima. Each sample is one statement, so one snapshot: the counts are exact at that instant."""

    def __init__(self, conn: Conn, queue: str = "q") -> None:
        self.conn = conn
        self.queue = queue
        self.max_group: collections.Counter[str | None] = collections.Counter()
        self.max_total = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            counts = active(self.conn, self.queue)
            self.samples += 1
            self.max_total = max(self.max_total, sum(counts.values()))
            for g, n in counts.items():
                self.max_group[g] = max(self.max_group[g], n)

    def __enter__(self) -> Checker:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)


def _hammer(connect: ConnectFactory, total: int, claimers: int = 8, seconds: float = 60) -> int:
    """`claimers` threads, each with its own connection, claim 1-3 jobs, hold them 2-8 milliseconds and
    complete them, until `total` jobs are done (or time runs out). Returns the number done."""
    done = [0]
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def worker(i: int) -> None:
        c = connect()
        rnd = random.Random(i)
        while time.monotonic() < deadline:
            with lock:
                if done[0] >= total:
                    return
            rows = claim(c, f"w{i}", queues=["q"], max_jobs=rnd.randint(1, 3))
            if not rows:
                time.sleep(0.001)
                continue
            time.sleep(0.002 + rnd.random() * 0.006)  # long enough that the claimers saturate the caps
            complete(c, rows)
            with lock:
                done[0] += len(rows)

    run_threads(claimers, worker, timeout=seconds + 30)
    return done[0]


@pytest.mark.smoke
@pytest.mark.parametrize("fair", [True, False], ids=["fair", "claim-order"])
def test_caps_hold_under_8_concurrent_claimers(connect: ConnectFactory, fair: bool) -> None:
    setup = connect()
    # three groups at their cap of 2 fill the queue's 6: both caps are pressed against
    call(setup, "configure_queue", queue="q", fair=fair, max_active=6, max_active_per_group=2)
    for g in range(3):
        put(setup, f"g{g}", 50)
    put(setup, None, 10)  # ungrouped jobs count against max_active only
    with Checker(connect()) as checker:
        done = _hammer(connect, 160)
    assert done == 160
    assert checker.samples > 20
    grouped = {g: n for g, n in checker.max_group.items() if g is not None}
    assert max(grouped.values()) <= 2, checker.max_group
    assert checker.max_total <= 6, checker.max_total
    # the caps were actually pressed against, not trivially met
    assert checker.max_total == 6 and max(grouped.values()) == 2


def test_max_active_alone_holds_under_8_concurrent_claimers(connect: ConnectFactory) -> None:
    setup = connect()
    call(setup, "configure_queue", queue="q", max_active=3)
    put(setup, None, 60)
    put(setup, "g", 60)
    with Checker(connect()) as checker:
        assert _hammer(connect, 120) == 120
    assert checker.max_total == 3


def test_a_claimer_waits_for_the_previous_claim_to_commit(connect: ConnectFactory) -> None:
    """Not even briefly: the second claimer cannot count before the first one's lease is visible."""
    first, second, watcher = connect(), connect(), connect()
    call(first, "configure_queue", queue="q", max_active=1)
    put(first, None, 5)
    got: list[list[dict[str, Any]]] = []
    with first.transaction():
        assert len(claim(first, "w1", queues=["q"], max_jobs=3)) == 1
        t = threading.Thread(target=lambda: got.append(claim(second, "w2", queues=["q"])), daemon=True)
        t.start()
        # the second claimer waits on the queue's claim lock instead of counting a picture without w1's lease
        pid = second.info.backend_pid
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            row = watcher.execute("SELECT wait_event FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()
            if row == ("advisory",):
                break
            time.sleep(0.01)
        assert row == ("advisory",)
        assert t.is_alive()
    t.join(10)
    assert got == [[]]
    assert sum(active(first).values()) == 1


def test_per_group_cap_leaves_room_for_the_other_groups(conn: Conn) -> None:
    call(conn, "configure_queue", queue="q", max_active_per_group=2)
    put(conn, "A", 10)
    assert [r["group_key"] for r in claim(conn, queues=["q"], max_jobs=10)] == ["A", "A"]
    assert claim(conn, queues=["q"], max_jobs=10) == []
    put(conn, "B", 10)
    assert [r["group_key"] for r in claim(conn, queues=["q"], max_jobs=10)] == ["B", "B"]
    assert active(conn) == {"A": 2, "B": 2}


def test_per_group_cap_on_a_fair_queue(conn: Conn) -> None:
    call(conn, "configure_queue", queue="q", fair=True, max_active_per_group=1, max_active=10)
    for g in "ABC":
        put(conn, g, 5)
    got = claim(conn, queues=["q"], max_jobs=10)
    assert sorted(r["group_key"] for r in got) == ["A", "B", "C"]
    complete(conn, [got[0]])
    assert [r["group_key"] for r in claim(conn, queues=["q"], max_jobs=10)] == [got[0]["group_key"]]


def test_an_expired_lease_does_not_count_and_reclaiming_it_re_leases_it(conn: Conn) -> None:
    call(conn, "configure_queue", queue="q", max_active=1, max_active_per_group=1)
    first, _ = put(conn, "A", 2)
    got = claim(conn, "w1", queues=["q"])
    assert [r["id"] for r in got] == [first]
    assert claim(conn, "w2", queues=["q"]) == []
    expire(conn, first)
    again = claim(conn, "w2", queues=["q"])
    assert [(r["id"], r["attempt"]) for r in again] == [(first, 2)]
    assert active(conn) == {"A": 1}
    assert claim(conn, "w3", queues=["q"]) == []


def test_kind_limits_on_a_capped_queue(conn: Conn) -> None:
    call(conn, "configure_queue", queue="q", max_active=10, max_active_per_group=3)
    put(conn, "A", 5, kind="x")
    put(conn, "B", 5, kind="y")
    put(conn, "C", 5, kind="z")
    got = claim(conn, queues=["q"], max_jobs=10, kind_limits={"x": 2, "y": 5})
    assert collections.Counter((r["group_key"], r["kind"]) for r in got) == {("A", "x"): 2, ("B", "y"): 3}
    got = claim(conn, queues=["q"], max_jobs=10, kind_limits={"x": 5})
    assert [(r["group_key"], r["kind"]) for r in got] == [("A", "x")]  # A is at its cap of 3 now


def test_caps_across_plain_and_capped_queues_in_one_claim(conn: Conn) -> None:
    call(conn, "configure_queue", queue="capped", max_active=2)
    put(conn, None, 5, queue="capped")
    put(conn, None, 5, queue="plain")
    got = claim(conn, queues=["plain", "capped"], max_jobs=10)
    assert collections.Counter(r["queue"] for r in got) == {"plain": 5, "capped": 2}


def test_removing_a_cap_lets_more_run(conn: Conn) -> None:
    call(conn, "configure_queue", queue="q", max_active=1)
    put(conn, None, 5)
    assert len(claim(conn, queues=["q"], max_jobs=5)) == 1
    call(conn, "configure_queue", queue="q", max_active=0)
    assert len(claim(conn, queues=["q"], max_jobs=5)) == 4


@pytest.mark.parametrize(
    "settings", [{"max_active": 1}, {"fair": True}, {"max_active_per_group": 1}], ids=["capped", "fair", "per-group"]
)
def test_a_capped_or_fair_claim_needs_read_committed(connect: ConnectFactory, settings: dict[str, Any]) -> None:
    """Claims of a capped or fair queue take turns under the queue's lock; a snapshot older than the lock could
    miss what the claim before leased, so REPEATABLE READ is refused (PJ002) and changes nothing."""
    c = connect()
    call(c, "configure_queue", queue="q", **settings)
    put(c, "g", 1)
    with c.transaction():
        c.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        with raises_pj("PJ002", "READ COMMITTED"):
            claim(c, queues=["q"])
    assert len(claim(c, queues=["q"])) == 1


def test_paused_capped_queue_gives_nothing(conn: Conn) -> None:
    call(conn, "configure_queue", queue="q", max_active=5, paused=True)
    put(conn, None, 2)
    assert claim(conn, queues=["q"], max_jobs=5) == []
    call(conn, "configure_queue", queue="q", paused=False)
    assert len(claim(conn, queues=["q"], max_jobs=5)) == 2


def test_concurrent_capped_claimers_fill_but_never_overfill(connect: ConnectFactory) -> None:
    setup = connect()
    call(setup, "configure_queue", queue="q", fair=True, max_active=7, max_active_per_group=3)
    for g in "ABCD":
        put(setup, g, 10)
    results = run_threads(8, lambda i: claim(connect(), f"w{i}", queues=["q"], max_jobs=3))
    ids = [r["id"] for rows in results for r in rows]
    assert len(ids) == len(set(ids)) == 7
    counts = active(setup)
    assert sum(counts.values()) == 7 and max(counts.values()) <= 3


def test_due_scheduled_jobs_are_claimable_on_a_capped_queue(conn: Conn) -> None:
    call(conn, "configure_queue", queue="q", max_active=2, max_active_per_group=1)
    ids = [
        r["id"]
        for r in call(
            conn,
            "enqueue_many",
            jobs=[{"kind": "k", "queue": "q", "group_key": g, "run_at": "2999-01-01T00:00:00Z"} for g in "ABC"],
        )
    ]
    assert claim(conn, queues=["q"], max_jobs=5) == []
    conn.execute("UPDATE pgjobs.jobs SET run_at = now() - interval '1 second' WHERE id = ANY (%s)", [ids])
    got = claim(conn, queues=["q"], max_jobs=5)
    assert [r["id"] for r in got] == ids[:2]  # claim order, within max_active
    assert active(conn) == {"A": 1, "B": 1}

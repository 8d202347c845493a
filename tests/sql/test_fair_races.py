"""Fair claims side by side (sql/fairness.sql): concurrent claimers while groups come and go never share a job
and leave none behind, a group whose first place in the ring was drawn by a claim still open when another
claim moved the ring's start is not left below it (its jobs stayed pending for good), and claims that
register the same new groups do not deadlock."""

from __future__ import annotations

import contextlib
import random
import threading
from typing import Any

import psycopg
import pytest
from conftest import ConnectFactory

from tests.helpers.foundation import call, claim, held_snapshot, run_threads

Conn = psycopg.Connection[Any]


def _put(conn: Conn, groups: list[str]) -> list[int]:
    return [
        r["id"] for r in call(conn, "enqueue_many", jobs=[{"kind": "k", "queue": "q", "group_key": g} for g in groups])
    ]


def _complete(conn: Conn, rows: list[dict[str, Any]]) -> None:
    if rows:
        call(conn, "complete_many", ids=[r["id"] for r in rows], lease_tokens=[r["lease_token"] for r in rows])


@pytest.mark.parametrize("held", [False, True], ids=["clean", "held-snapshot"])
def test_concurrent_claimers_never_share_a_job_and_leave_none_behind(connect: ConnectFactory, held: bool) -> None:
    """A producer puts a few jobs at a time into 20 groups while four sessions claim up to 10 each and finish
    what they took: every job is taken once, and all of them are taken. (Before 2026-12-06 about half the runs
    left jobs pending for good, or failed with a deadlock between two claims registering groups.) Also under a
    held snapshot, where the claimers' probes prove dear and the head floors engage: floors kept per session,
    floors in the cursors carried on and spread, floors of groups found empty (_fair_floor_empty) rewriting
    cursors a claim holds while the walk takes over its ring."""
    setup = connect()
    call(setup, "configure_queue", queue="q", fair=True)
    total = 1200
    done = threading.Event()
    made: list[int] = []

    def produce() -> None:
        c = connect()
        rnd = random.Random(7)
        while len(made) < total:
            made.extend(_put(c, [f"g{rnd.randrange(20)}" for _ in range(rnd.randrange(1, 8))]))
        done.set()

    producer = threading.Thread(target=produce)
    producer.start()

    def consume(i: int) -> list[int]:
        c = connect()
        mine: list[int] = []
        idle = 0
        while idle < 20:
            rows = claim(c, f"w{i}", queues=["q"], max_jobs=10)
            _complete(c, rows)
            mine += [r["id"] for r in rows]
            idle = idle + 1 if not rows and done.is_set() else 0
        return mine

    with held_snapshot(connect) if held else contextlib.nullcontext():
        taken = [i for ids in run_threads(4, consume, timeout=120) for i in ids]
        producer.join(10)
        floored = setup.execute("SELECT count(*) FROM pgjobs.group_cursors WHERE floor_epoch IS NOT NULL").fetchone()
    # (under the snapshot the floors did engage; without one they may too when a machine under load makes
    # the probes slow, so that case asserts nothing about them)
    assert floored is not None and (floored[0] > 0 or not held)
    assert len(taken) == len(set(taken))
    assert sorted(taken) == sorted(made)


def test_a_place_drawn_by_an_open_claim_stays_above_the_rings_start(connect: ConnectFactory) -> None:
    """Session A serves a new group g in a transaction it keeps open (g's first place is drawn, not committed).
    Meanwhile B claims and finishes work in other groups, enough claims for the ring's start (ring_from) to be
    raised past every place B can see. A commits; g gets more work; B's claims must still reach g."""
    a, b = connect(), connect()
    call(b, "configure_queue", queue="q", fair=True)
    hs = [f"h{i}" for i in range(5)]
    for _ in range(3):
        _put(b, hs)
        _complete(b, claim(b, "b", queues=["q"], max_jobs=5))
    _put(b, ["g"])
    with a.transaction():
        got = claim(a, "a", queues=["q"], max_jobs=1)
        assert [r["group_key"] for r in got] == ["g"]
        for _ in range(24):  # every 8th claim may raise ring_from
            _put(b, hs)
            _complete(b, claim(b, "b", queues=["q"], max_jobs=5))
        _complete(a, got)
    row = b.execute(
        "SELECT min(c.served_seq) >= min(f.ring_from) FROM pgjobs.group_cursors AS c, pgjobs.fair_queues AS f"
        " WHERE c.queue = 'q' AND f.queue = 'q' AND c.served_seq > 0"
    ).fetchone()
    assert row == (True,)
    mine = _put(b, ["g", "g"])
    seen: list[int] = []
    for _ in range(10):
        rows = claim(b, "b", queues=["q"], max_jobs=5)
        seen += [r["id"] for r in rows]
        _complete(b, rows)
    assert set(mine) <= set(seen)


def test_the_ring_raise_runs_alone_under_read_committed_and_lets_go_of_its_lock(connect: ConnectFactory) -> None:
    """_fair_ring_raise reads the ring's lowest place only while no other claim of the queue is between
    drawing places and committing (their share of the ring lock), only under READ COMMITTED (a snapshot
    older than the lock would miss claims that committed before it), only for a claim that is not quiet, and
    holds the lock in exclusive mode for that read alone: none is left held after the call."""
    a, b = connect(), connect()
    call(a, "configure_queue", queue="q", fair=True)
    _put(a, ["g1", "g2", "g1"])
    for _ in range(2):
        _complete(a, claim(a, "a", queues=["q"], max_jobs=2))

    def raise_(conn: Conn) -> Any:
        row = conn.execute("SELECT pgjobs._fair_ring_raise('q', false)").fetchone()
        assert row is not None
        return row[0]

    held = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
    assert raise_(a) is not None
    assert a.execute(held).fetchone() == (0,)
    assert a.execute("SELECT pgjobs._fair_ring_raise('q', true)").fetchone() == (None,)  # a quiet claim
    with a.transaction():
        a.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        assert raise_(a) is None
    with b.transaction():
        b.execute("SELECT pg_advisory_xact_lock_shared(hashtextextended('pgjobs.ring:q', 0))")  # a claim in flight
        assert raise_(a) is None
    assert raise_(a) is not None
    assert a.execute(held).fetchone() == (0,)

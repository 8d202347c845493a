"""Fair claims side by side (sql/fair.sql): concurrent claimers while groups come and go never share a job
and leave none behind, with and without a held snapshot; and a group whose jobs a producer commits late,
after many claims moved the ring on, is taken by the first claim after that commit."""

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
    what they took: every job is taken once, and all of them are taken; also under a held snapshot, which
    every ring row's in-progress list then names."""
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
    assert len(taken) == len(set(taken))
    assert sorted(taken) == sorted(made)


def test_a_group_committed_late_is_taken_by_the_first_claim_after_its_commit(connect: ConnectFactory) -> None:
    """Session A enqueues into a new group g and a known group h in a transaction it keeps open while B
    claims and finishes work in other groups (ring rows written with A in progress); A commits; B's next
    claim takes g's and h's jobs, though their run_at sorts before every job B took meanwhile."""
    a, b = connect(), connect()
    call(b, "configure_queue", queue="q", fair=True)
    hs = [f"h{i}" for i in range(5)]
    _put(b, hs)
    _complete(b, claim(b, "b", queues=["q"], max_jobs=5))
    with a.transaction():
        mine = _put(a, ["g", "g", "h0"])
        for _ in range(24):
            _put(b, hs)
            _complete(b, claim(b, "b", queues=["q"], max_jobs=5))
    got = claim(b, "b", queues=["q"], max_jobs=3)
    assert sorted(r["id"] for r in got) == sorted(mine)

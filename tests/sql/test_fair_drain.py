"""The drain of a fair claim (sql/fairness.sql, _fair_drain): when every pending job of the ring's groups fits in
the claim, the claim takes them all in one statement instead of the pick-by-pick walk. It picks what the walk
picks, in the walk's order, and leaves the ring in the walk's order; it keeps the cursors of groups with
nothing pending (the walk deletes those), so a group that runs dry and comes back keeps its place; and it
never runs when more is pending than the claim takes. (Concurrent claimers: test_fair_races.py.)"""

from __future__ import annotations

import random
from typing import Any

import psycopg
import pytest
from conftest import ConnectFactory

from tests.helpers.foundation import call, claim

Conn = psycopg.Connection[Any]


def _fair(conn: Conn, queue: str, **settings: Any) -> None:
    call(conn, "configure_queue", queue=queue, fair=True, **settings)


def _put(conn: Conn, queue: str, spec: list[tuple[str, int]]) -> list[int]:
    jobs = [{"kind": "k", "queue": queue, "group_key": g, "priority": p} for g, p in spec]
    return [r["id"] for r in call(conn, "enqueue_many", jobs=jobs)]


def _complete(conn: Conn, rows: list[dict[str, Any]]) -> None:
    if rows:
        call(conn, "complete_many", ids=[r["id"] for r in rows], lease_tokens=[r["lease_token"] for r in rows])


def _claim_counting(conn: Conn, queue: str, n: int) -> tuple[list[dict[str, Any]], int]:
    """One claim, and how many drains took jobs in it (_fair_stamp is called by the drain and the fast path
    only when they took the claim; the drain's own calls tell the two apart: pg_stat_xact_user_functions)."""
    calls = (
        "SELECT coalesce(sum(calls) FILTER (WHERE funcname = '_fair_drain'), 0),"
        " coalesce(sum(calls) FILTER (WHERE funcname = '_fair_fast'), 0),"
        " coalesce(sum(calls) FILTER (WHERE funcname = '_fair_stamp'), 0),"
        " coalesce(sum(calls) FILTER (WHERE funcname = '_fair_walk'), 0)"
        " FROM pg_stat_xact_user_functions WHERE schemaname = 'pgjobs'"
    )
    with conn.transaction():
        before = conn.execute(calls).fetchone()
        rows = claim(conn, "w", queues=[queue], max_jobs=n)
        after = conn.execute(calls).fetchone()
    assert before is not None and after is not None
    drain, fast, stamp, walk = (int(a - b) for a, b in zip(after, before, strict=True))
    # a drain that took the claim stamped it, and neither the fast path nor the walk ran after it
    drained = int(drain == 1 and stamp == 1 and fast == 0 and walk == 0)
    return rows, drained


@pytest.mark.parametrize("seed", range(6))
def test_a_drain_picks_what_the_walk_picks_in_its_order_round_after_round(connect: ConnectFactory, seed: int) -> None:
    """Two queues with the same jobs, round after round: a few jobs come into some of 8 groups (priorities
    mixed), a claim of 30 takes them all. The second queue's session claims by the walk alone. Each group
    keeps one job running (claimed at the start and never finished), so no cursor is ever deleted and the
    two rings can be compared; the noisy settings are drawn so that some rounds could turn a group noisy
    (the drain then leaves the claim to the walk)."""
    rnd = random.Random(seed)
    conn = connect()
    walk = connect()
    walk.execute("SET pgjobs.fair_walk_only = on")
    for c in (conn, walk):
        c.execute("SET track_functions = 'pl'")
        c.execute("SET pgjobs.fair_count_every = 0")  # no count kept between claims (see test_fairness)
    least, share = [(1000, 0.5), (3, 0.5), (2, 0.3)][seed % 3]
    noisy = {"noisy_min_active": least, "noisy_share": share}
    groups = [f"g{i}" for i in range(8)]
    for q, c in (("drain", conn), ("walk", walk)):
        _fair(conn, q, **noisy)
        _put(conn, q, [(g, 0) for g in groups])
        held = claim(c, "holder", queues=[q], max_jobs=8, lease="1 hour")
        assert sorted(r["group_key"] for r in held) == groups
    drained = 0
    for step in range(25):
        spec = [(rnd.choice(groups), rnd.choice([0, 0, 1, -1])) for _ in range(rnd.randrange(1, 12))]
        ids = {q: _put(conn, q, spec) for q in ("drain", "walk")}
        pos = {q: {i: n for n, i in enumerate(ids[q])} for q in ids}
        got_d, d = _claim_counting(conn, "drain", 30)
        got_w = claim(walk, "w", queues=["walk"], max_jobs=30)
        drained += d
        assert [pos["drain"][r["id"]] for r in got_d] == [pos["walk"][r["id"]] for r in got_w], (step, spec)
        assert len(got_d) == len(spec)
        rings = [
            [r[0] for r in conn.execute(
                "SELECT group_key FROM pgjobs.group_cursors WHERE queue = %s ORDER BY served_seq, group_key", [q]
            )]
            for q in ("drain", "walk")
        ]  # fmt: skip
        assert rings[0] == rings[1], step
        _complete(conn, got_d)
        _complete(walk, got_w)
    # (with a low noisy threshold the drain leaves many claims to the walk: a group could turn noisy)
    assert drained >= (5 if least == 2 else 20)


def test_more_pending_than_the_claim_takes_is_not_drained(conn: Conn) -> None:
    """Eleven jobs, ten of them in one group, a claim of four: the second group's job is among them (the walk's
    one pick per group first), not four of the first group's."""
    _fair(conn, "q")
    _put(conn, "q", [("a", 0)] * 10 + [("b", 0)])
    got = claim(conn, "w", queues=["q"], max_jobs=4)
    assert sorted(r["group_key"] for r in got) == ["a", "a", "a", "b"]


def test_a_group_that_runs_dry_keeps_its_cursor_and_its_place(conn: Conn) -> None:
    """Groups a, b, c served in that order; then only b and c get work: a's cursor stays (the walk would delete
    it, and a would come back never served); when a's work comes back it is served at its place, first."""
    conn.execute("SET track_functions = 'pl'")
    _fair(conn, "q")
    for _ in range(3):
        _put(conn, "q", [("a", 0), ("b", 0), ("c", 0)])
        got, _ = _claim_counting(conn, "q", 10)
        assert len(got) == 3
        _complete(conn, got)
    _put(conn, "q", [("b", 0), ("c", 0)])
    got, drained = _claim_counting(conn, "q", 10)
    assert drained and sorted(r["group_key"] for r in got) == ["b", "c"]
    _complete(conn, got)
    kept = conn.execute("SELECT count(*) FROM pgjobs.group_cursors WHERE queue = 'q' AND group_key = 'a'").fetchone()
    assert kept == (1,)
    _put(conn, "q", [("c", 0), ("b", 0), ("a", 0), ("a", 0)])
    got = claim(conn, "w", queues=["q"], max_jobs=2)
    assert [r["group_key"] for r in got] == ["a", "b"]

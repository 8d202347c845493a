"""The drain of a fair claim (sql/fairness.sql, _fair_drain): when every pending job of the ring's groups fits in
the claim, the claim takes them all in one statement instead of the pick-by-pick walk. It picks what the walk
picks, in the walk's order, and leaves the ring in the walk's order; it keeps the cursors of groups with
nothing pending (the walk deletes those), so a group that runs dry and comes back keeps its place; and it
never runs when more is pending than the claim takes. (Concurrent claimers: test_fair_races.py.)"""

from __future__ import annotations

import contextlib
import random
from typing import Any

import psycopg
import pytest
from conftest import ConnectFactory

from tests.helpers.fair import shortcut_and_walk
from tests.helpers.foundation import call, claim, held_snapshot, vacuum_clean

Conn = psycopg.Connection[Any]


def _fair(conn: Conn, queue: str, **settings: Any) -> None:
    call(conn, "configure_queue", queue=queue, fair=True, **settings)


def _put(conn: Conn, queue: str, spec: list[tuple[str, int]]) -> list[int]:
    jobs = [{"kind": "k", "queue": queue, "group_key": g, "priority": p} for g, p in spec]
    return [r["id"] for r in call(conn, "enqueue_many", jobs=jobs)]


def _complete(conn: Conn, rows: list[dict[str, Any]]) -> None:
    if rows:
        call(conn, "complete_many", ids=[r["id"] for r in rows], lease_tokens=[r["lease_token"] for r in rows])


def _claim_counting(conn: Conn, queue: str, n: int) -> tuple[list[dict[str, Any]], str]:
    """One claim, and which path took it (pg_stat_xact_user_functions): 'drain' (everything fitted), 'rounds'
    (after the fast path came up short: the drain's second call), 'fast', or 'walk'."""
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
    # (_fair_stamp runs once when the drain, the rounds or the fast path took the claim; never with the walk)
    path = {(1, 0, 1, 0): "drain", (2, 1, 1, 0): "rounds", (1, 1, 1, 0): "fast", (0, 1, 1, 0): "fast"}
    return rows, path.get((drain, fast, stamp, walk), "walk" if walk else "other")


@pytest.mark.parametrize("size", [30, 10, 4])
@pytest.mark.parametrize("seed", range(6))
def test_a_drain_and_rounds_pick_what_the_walk_picks_in_its_order(
    connect: ConnectFactory, seed: int, size: int
) -> None:
    """Two queues with the same jobs, round after round: a few jobs come into some of 8 groups (priorities
    mixed), then a claim of `size`: of 30 it takes them all (the drain), of 10 it takes some and the rest
    waits (rounds, when the fast path comes up short). The second queue's session claims by the walk alone.
    Each group keeps one job running (claimed at the start and never finished), so no cursor is ever deleted
    and the two rings can be compared; the noisy settings are drawn so that some claims could turn a group
    noisy (the drain and the rounds then leave the claim to the walk)."""
    rnd = random.Random(seed)
    conn, walk = shortcut_and_walk(connect)
    least, share = [(1000, 0.5), (3, 0.5), (2, 0.3)][seed % 3]
    noisy = {"noisy_min_active": least, "noisy_share": share}
    groups = [f"g{i}" for i in range(8)]
    for q, c in (("drain", conn), ("walk", walk)):
        _fair(conn, q, **noisy)
        _put(conn, q, [(g, 0) for g in groups])
        held = claim(c, "holder", queues=[q], max_jobs=8, lease="1 hour")
        assert sorted(r["group_key"] for r in held) == groups
    paths: list[str] = []
    pos: dict[str, dict[int, int]] = {"drain": {}, "walk": {}}
    for step in range(25):
        spec = [
            (rnd.choice(groups), rnd.choice([0, 0, 1, -1])) for _ in range(rnd.randrange(1, 12 if size > 10 else 18))
        ]
        for q in ("drain", "walk"):
            pos[q].update({i: len(pos[q]) for i in _put(conn, q, spec)})
        got_d, path = _claim_counting(conn, "drain", size)
        got_w = claim(walk, "w", queues=["walk"], max_jobs=size)
        paths.append(path)
        assert [pos["drain"][r["id"]] for r in got_d] == [pos["walk"][r["id"]] for r in got_w], (step, path)
        rings = [
            [r[0] for r in conn.execute(
                "SELECT group_key FROM pgjobs.group_cursors WHERE queue = %s ORDER BY served_seq, group_key", [q]
            )]
            for q in ("drain", "walk")
        ]  # fmt: skip
        assert rings[0] == rings[1], (step, path)
        _complete(conn, got_d)
        _complete(walk, got_w)
    # How often the path under test took the claim. With the lowest noisy threshold the drain leaves many
    # claims to the walk, and the rounds (which take two jobs of a group or more) all of them: a group could
    # turn noisy. Those runs check the paths agree with the walk whichever takes the claim.
    took = paths.count({30: "drain", 10: "rounds", 4: "fast"}[size])
    assert (
        took
        >= {(30, False): 10, (30, True): 3, (10, False): 3, (10, True): 0, (4, False): 5, (4, True): 0}[
            size, least == 2
        ]
    ), paths


def test_the_fast_path_passes_over_groups_with_nothing_pending(connect: ConnectFactory) -> None:
    """Groups at the front of the ring with nothing pending (each still has a job running, so its cursor stays)
    are passed over by the fast path, as by the walk: a claim of 4 takes the heads of the first 4 groups in ring
    order that have one, in one more pass over the ring as read. Before, one dry group among the first 4 sent
    the claim to the walk, pick by pick (a third of the claimer's time in the fair soak under a held snapshot)."""
    conn, walk = shortcut_and_walk(connect)
    groups = [f"g{i}" for i in range(8)]
    for q, c in (("fast", conn), ("walk", walk)):
        _fair(conn, q)
        _put(conn, q, [(g, 0) for g in groups])
        assert len(claim(c, "holder", queues=[q], max_jobs=8, lease="1 hour")) == 8  # ring: g0 .. g7
    wet = ["g1", "g3", "g5", "g6", "g7"]
    picks: dict[str, list[str]] = {}
    for q in ("fast", "walk"):
        _put(conn, q, [(g, 0) for g in wet for _ in range(2)])
    got, path = _claim_counting(conn, "fast", 4)
    picks["fast"] = [r["group_key"] for r in got]
    picks["walk"] = [r["group_key"] for r in claim(walk, "w", queues=["walk"], max_jobs=4)]
    assert picks["fast"] == picks["walk"] == ["g1", "g3", "g5", "g6"]
    assert path == "fast"
    # and the next claim starts after them: g7, then the groups just served, in the order they were served
    got, path = _claim_counting(conn, "fast", 3)
    assert [r["group_key"] for r in got] == [r["group_key"] for r in claim(walk, "w", queues=["walk"], max_jobs=3)]
    assert [r["group_key"] for r in got] == ["g7", "g1", "g3"] and path == "fast"


def test_the_fast_path_reads_on_past_a_front_of_the_ring_another_claim_holds(connect: ConnectFactory) -> None:
    """A claim of one while another claim, still open, holds the first 30 cursors of a ring of 40 groups: the fast
    path reads on past the 18 cursors it reads first and takes the first free group's head (the walk passes over
    held cursors alike). Before, such a claim walked: in the fair soak, most claims of the probe beside the
    worker's claim of 50 (53 ms each under a held snapshot)."""
    conn, walk = shortcut_and_walk(connect)
    holder = connect()
    groups = [f"g{i:02}" for i in range(40)]
    _fair(conn, "q")
    _put(conn, "q", [(g, 0) for g in groups for _ in range(3)])
    first = claim(conn, "w", queues=["q"], max_jobs=40)  # ring: g00 .. g39
    assert [r["group_key"] for r in first] == groups
    _complete(conn, first)
    with holder.transaction():
        held = claim(holder, "holder", queues=["q"], max_jobs=30)
        assert [r["group_key"] for r in held] == groups[:30]
        got, path = _claim_counting(conn, "q", 1)
        assert [r["group_key"] for r in got] == ["g30"]
        assert path == "fast"
        got = claim(walk, "w", queues=["q"], max_jobs=1)  # the walk alone, for comparison
        assert [r["group_key"] for r in got] == ["g31"]


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


_DRAIN = (
    "SELECT d.ids FROM pgjobs._fair_drain('q', 50, NULL, 0, false, '{}', '{}', 0, 1000, 1, NULL, false, false,"
    " true, NULL, false, 0, false, NULL) AS d"
)
_KEEP_DRAIN = (
    "SELECT set_config('pgjobs.fair_kept', jsonb_build_object('d q', jsonb_build_array("
    " extract(epoch FROM clock_timestamp()) - %s, NULL, %s))::text, false)"
)


@pytest.mark.parametrize(
    ("age", "took", "skipped"),
    [(5.0, 1.0, True), (25.0, 1.0, False), (0.5, 0.01, True), (1.5, 0.01, False)],
    ids=["within-20x", "past-20x", "within-a-second", "past-a-second"],
)
def test_a_dear_drain_is_left_alone_for_twenty_times_what_it_took(
    conn: Conn, age: float, took: float, skipped: bool
) -> None:
    """A drain (or rounds) whose reads proved dear, as under a held snapshot, is left to the fast path and the walk
    for pgjobs.fair_count_every seconds or 20 times what it took, when that is longer: for a second only, the
    rounds after a fast path without floors ran every 20 s in the fair soak's hold, 4-6 s each. The drain kept
    `age` seconds ago after `took` seconds reads nothing (jobs_group_idx entries the call was handed), or reads."""
    _fair(conn, "q")
    _put(conn, "q", [(f"g{i}", 0) for i in range(5)])
    _complete(conn, call(conn, "claim", worker="w", queues=["q"], max_jobs=1))  # the groups' cursors
    conn.execute("SET pgjobs.fair_count_every = 1")
    conn.execute(_KEEP_DRAIN, [age, took])
    visits = "SELECT pg_stat_get_xact_tuples_returned('pgjobs.jobs_group_idx'::regclass)"
    with conn.transaction(force_rollback=True):
        before = conn.execute(visits).fetchone()[0]  # type: ignore[index]
        got = conn.execute(_DRAIN).fetchone()[0]  # type: ignore[index]
        read = conn.execute(visits).fetchone()[0] - before  # type: ignore[index]
    assert (read == 0 and got is None) == skipped, (read, got)


@pytest.mark.parametrize(
    ("held", "keeps"), [(True, False), (False, False), (False, True)], ids=["held-snapshot", "clean", "keeps-reads"]
)
def test_no_rounds_after_a_fast_path_whose_probes_proved_dear(
    conn: Conn, connect: ConnectFactory, held: bool, keeps: bool
) -> None:
    """The rounds probe every group from the front. After a fast path that came up short and whose own probes from
    the front proved dear (a held snapshot keeps the dead entry of every job each group had claimed since), they
    would pay it all again (6.5 s ten minutes into the fair soak's hold): the walk takes the claim instead; so too
    for a session that keeps a dear read (run M's rounds, 6.1 s, followed a fast path that had probed nothing).
    Without dead entries to pass, the same claim tries the rounds (calls of _fair_rounds)."""
    _fair(conn, "q")
    conn.execute("SET track_functions = 'pl'")
    conn.execute("SET pgjobs.fair_count_every = 0")  # (nothing kept: no floors, no gates; every claim reads)
    later = [{"kind": "k", "queue": "q", "group_key": f"g{i:02}", "run_at": "2999-01-01T00:00:00Z"} for i in range(20)]
    call(conn, "enqueue_many", jobs=later)  # (every group keeps its cursor when it runs dry)
    _put(conn, "q", [(f"g{i:02}", 0) for i in range(20)] * 50)
    with held_snapshot(connect) if held else contextlib.nullcontext():
        while len(rows := claim(conn, "w", queues=["q"], max_jobs=50)) == 50:
            _complete(conn, rows)  # ~50 claimed jobs of every group before its end
        _complete(conn, rows)
        if not held:
            vacuum_clean(conn, "jobs")  # (the claimed jobs' dead versions gone: the probes pass none)
        _put(conn, "q", [(f"g{i:02}", 0) for i in range(0, 20, 4)] * 3)  # 15 jobs in 5 of the 20 groups
        if keeps:  # (a look for ungrouped work that proved dear, kept: the session keeps reads)
            conn.execute("SELECT set_config('pgjobs.fair_kept', '{\"u q\": [0, null]}', false)")
        rounds = "SELECT coalesce(sum(calls), 0) FROM pg_stat_xact_user_functions WHERE funcname = '_fair_rounds'"
        with conn.transaction():
            before = conn.execute(rounds).fetchone()[0]  # type: ignore[index]
            got = claim(conn, "w", queues=["q"], max_jobs=10)
            ran = conn.execute(rounds).fetchone()[0] - before  # type: ignore[index]
    assert len(got) == 10
    assert ran == (0 if held or keeps else 1), ran

"""Claims under a held snapshot: the scan floors of ``sql/claim.sql`` ("Scan floors").

A foreign session idle in a transaction keeps every dead version newer than its snapshot. A claim that scans
``jobs_pending_idx`` from its front visits every job claimed since (a heap fetch each). With a floor, a claimer
session starts its scans where its last claim found live work, so the next claim's cost does not grow with the
number of dead versions; every statement that makes a job claimable below a floor moves the epoch, and a safety
net scans from the front now and then.

Most tests turn the floors on at once (``pgjobs.claim_floor_engage = 0``; by default a session takes floors only
once a scan from the front wasted 500 index visits) and push the safety net out of the way
(``pgjobs.claim_full_scan_every``), so that what they see is the floor and the epoch, not the net.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from conftest import ConnectFactory

from tests.helpers.foundation import call, claim, enqueue, enqueue_n, held_snapshot, scalar
from tests.helpers.foundation import claim_index_visits as visits

Conn = psycopg.Connection[Any]
PAST = "2001-02-03T04:05:06Z"
OLD_TX = 0.45  # seconds an "old" transaction is held open before it writes (the floors' margin is 0.3 s)


def floored(conn: Conn, every: str = "1 hour") -> Conn:
    """Floors from this session's first claim on; the safety net every ``every`` (whatever the claim count)."""
    conn.execute("SET pgjobs.claim_floor_engage = 0")
    conn.execute("SET pgjobs.claim_full_scan_claims = 0")
    conn.execute("SELECT set_config('pgjobs.claim_full_scan_every', %s, false)", [every])
    return conn


def state(conn: Conn) -> dict[str, Any]:
    text = conn.execute("SELECT current_setting('pgjobs.claim_floor', true)").fetchone()[0]  # type: ignore[index]
    return json.loads(text) if text else {}


def epoch(conn: Conn) -> int:
    row = conn.execute("SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM pgjobs.claim_floor_epoch").fetchone()
    assert row is not None
    return int(row[0])


def take(conn: Conn, queue: str = "default", n: int = 1, kinds: bool = False) -> list[int]:
    """Claims (fast path, or _claim_plain through kind_limits) and completes; the ids in claim order."""
    extra: dict[str, Any] = {"kind_limits": {"k": n, "other": n}} if kinds else {}
    got = claim(conn, "w", queues=[queue], max_jobs=n, **extra)
    if got:
        scalar(conn, "complete_many", ids=[g["id"] for g in got], lease_tokens=[g["lease_token"] for g in got])
    return [g["id"] for g in got]


def first_in_order(conn: Conn, queue: str = "default") -> int | None:
    """The job a claim from the front takes first: the contract's order (priority, run_at, id)."""
    row = conn.execute(
        "SELECT id FROM pgjobs.jobs WHERE state = 'pending' AND queue = %s ORDER BY priority, run_at, id LIMIT 1",
        [queue],
    ).fetchone()
    return None if row is None else int(row[0])


def measured_claim(conn: Conn, queue: str) -> tuple[int, int]:
    """(index entries visited, shared buffers touched) by one claim call, from EXPLAIN (ANALYZE, BUFFERS)."""
    before = visits(conn)
    row = conn.execute(
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT * FROM pgjobs.claim('w', ARRAY[%s])", [queue]
    ).fetchone()
    assert row is not None
    plan = row[0][0]["Plan"]
    return visits(conn) - before, int(plan["Shared Hit Blocks"]) + int(plan["Shared Read Blocks"])


def test_claim_cost_does_not_grow_with_dead_versions(conn: Conn, connect: ConnectFactory) -> None:
    """200 and then 2000 jobs claimed and completed one by one under a held snapshot: the next claim visits as
    many index entries and touches as many buffers after 2000 as after 200 (from the front: 2000 more)."""
    floored(conn)
    enqueue_n(conn, 220, queue="n200", run_at=PAST)
    enqueue_n(conn, 2020, queue="n2000", run_at=PAST)
    # Statistics before the first claim plans its statements: planned on a table it believes empty, the
    # update by id may seq-scan jobs (every dead version), which is not what this test is about.
    conn.execute("ANALYZE pgjobs.jobs")
    measured = {}
    with held_snapshot(connect):
        for queue, n in (("n200", 200), ("n2000", 2000)):
            for _ in range(n):
                assert len(take(conn, queue)) == 1
            measured[n] = measured_claim(conn, queue)
    (v200, b200), (v2000, b2000) = measured[200], measured[2000]
    assert v2000 <= v200 + 10, measured
    assert b2000 <= b200 + 10, measured
    assert state(conn)["q"]["n2000"]["p"], "the session took a floor"


def test_a_fresh_session_scans_from_the_front_and_takes_floors_once_that_wastes(
    conn: Conn, connect: ConnectFactory
) -> None:
    """Default settings: no floor while scanning from the front costs nothing; once a claim from the front walks
    past hundreds of dead entries, the session's next claims start past them."""
    producer = connect()
    enqueue_n(producer, 1100, run_at=PAST)
    with held_snapshot(connect):
        for _ in range(1000):
            assert len(take(producer, "default")) == 1
        assert state(conn) == {}
        first, _ = measured_claim(conn, "default")  # a fresh session: from the front, through 1000 dead entries
        assert first >= 1000
        assert state(conn).get("q", {}).get("default")
        second, _ = measured_claim(conn, "default")
        assert second < 50
    # without dead entries to walk, a scan from the front (the safety net) drops the floors again
    conn.execute("SET pgjobs.claim_full_scan_every = '0'")
    conn.execute("SELECT set_config('pgjobs.claim_floor', '', false)")
    producer.execute("VACUUM pgjobs.jobs")
    measured_claim(conn, "default")
    assert state(conn) == {}


def old_transaction(connect: ConnectFactory, body: Callable[[Conn], Any], before: Callable[[], Any]) -> None:
    """Runs ``body`` in a transaction that began OLD_TX seconds earlier (its now(), the run_at it gives a job, is
    old); ``before`` runs after the transaction began and before ``body`` (the claimer takes its floor there)."""
    w = connect()
    w.autocommit = False
    w.execute("SELECT now()")
    time.sleep(OLD_TX)
    before()
    body(w)
    w.commit()


KINDS = pytest.mark.parametrize("kinds", [False, True], ids=["fast_path", "kind_limits"])


@KINDS
def test_an_enqueue_with_a_past_run_at_is_claimed_first(conn: Conn, connect: ConnectFactory, kinds: bool) -> None:
    floored(conn)
    producer = connect()
    enqueue_n(producer, 30)
    with held_snapshot(connect):
        take(conn, n=5, kinds=kinds)
        assert state(conn)["q"]["default"]["p"]
        e0 = epoch(conn)
        old = enqueue(producer, run_at=PAST)["id"]
        many = call(producer, "enqueue_many", jobs=[{"kind": "k", "run_at": "2002-01-01T00:00:00Z"}])[0]["id"]
        assert take(conn, n=2, kinds=kinds) == [old, many]
        assert epoch(conn) > e0


@KINDS
def test_jobs_made_pending_by_an_old_transaction_are_claimed(conn: Conn, connect: ConnectFactory, kinds: bool) -> None:
    """fail (retry now), release and retry give the job run_at = now(): the start of their transaction, which may
    sort below the floor a claimer took meanwhile. Each moves the epoch, and the next claim takes the job."""
    floored(conn)
    other = connect()
    ids = enqueue_n(other, 2, max_attempts=3)
    got = {g["id"]: g["lease_token"] for g in claim(other, "other", max_jobs=2)}
    with held_snapshot(connect):
        actions: list[tuple[int, Callable[[Conn], Any]]] = [
            (ids[0], lambda w: scalar(w, "fail", id=ids[0], lease_token=got[ids[0]], error="boom", retry_at=PAST)),
            (ids[1], lambda w: scalar(w, "release", id=ids[1], lease_token=got[ids[1]])),
        ]
        for jid, body in actions:
            e0 = epoch(conn)
            old_transaction(connect, body, before=lambda: take(conn, kinds=kinds))
            assert take(conn, kinds=kinds) == [jid]
            assert epoch(conn) > e0
        # retry: a job that failed for good
        failed = enqueue(other, max_attempts=1)["id"]
        tok = claim(other, "other")[0]["lease_token"]
        assert scalar(other, "fail", id=failed, lease_token=tok, error="x") == "failed"
        e0 = epoch(conn)
        old_transaction(connect, lambda w: call(w, "retry", id=failed), before=lambda: take(conn, kinds=kinds))
        assert take(conn, kinds=kinds) == [failed]
        assert epoch(conn) > e0


@KINDS
def test_a_released_dependent_is_claimed_in_order(conn: Conn, connect: ConnectFactory, kinds: bool) -> None:
    """A child waits; when its parent completes it becomes pending with the run_at it was enqueued with."""
    floored(conn)
    other = connect()
    rows = call(
        other,
        "enqueue_many",
        jobs=[{"kind": "k", "ref": "p", "queue": "parents"}, {"kind": "k", "depends_on": [{"ref": "p"}]}],
    )
    child = rows[1]["id"]
    enqueue_n(other, 5)
    time.sleep(OLD_TX)
    with held_snapshot(connect):
        backlog = take(conn, n=5, kinds=kinds)  # the floor now lies past the child's run_at
        assert len(backlog) == 5 and take(conn, kinds=kinds) == []
        e0 = epoch(conn)
        assert take(other, "parents") == [rows[0]["id"]]
        assert first_in_order(conn) == child
        assert take(conn, kinds=kinds) == [child]
        assert epoch(conn) > e0


@KINDS
def test_a_scheduled_job_promoted_below_the_floor_is_claimed(conn: Conn, connect: ConnectFactory, kinds: bool) -> None:
    """A job scheduled 50 ms after the start of a transaction that commits later than that: by the time a claim
    sees it due, its run_at lies below the floor this session took meanwhile. Its promotion moves the epoch."""
    floored(conn)
    made: list[int] = []

    def body(w: Conn) -> None:
        row = w.execute(
            "SELECT id, state::text FROM pgjobs.enqueue('k', run_at => now() + interval '50 ms')"
        ).fetchone()
        assert row is not None and row[1] == "scheduled"
        made.append(int(row[0]))

    with held_snapshot(connect):
        e0 = epoch(conn)
        old_transaction(connect, body, before=lambda: take(conn, kinds=kinds))
        assert take(conn, kinds=kinds) == made
        assert epoch(conn) > e0


@KINDS
def test_reaped_workers_jobs_are_reclaimed(conn: Conn, connect: ConnectFactory, kinds: bool) -> None:
    """reap_workers moves the leases of a gone worker's jobs into the past, below a claimer's lease floor."""
    floored(conn)
    other = connect()
    jid = enqueue(other)["id"]
    call(other, "worker_heartbeat", worker="gone", meta={})
    assert [g["id"] for g in claim(other, "gone", lease="1 hour")] == [jid]
    with held_snapshot(connect):
        e0 = epoch(conn)
        old_transaction(
            connect, lambda w: scalar(w, "reap_workers", stale_after="0"), before=lambda: take(conn, kinds=kinds)
        )
        got = claim(conn, "w", max_jobs=1, **({"kind_limits": {"k": 1, "other": 1}} if kinds else {}))
        assert [(g["id"], g["attempt"]) for g in got] == [(jid, 2)]
        assert epoch(conn) > e0


@KINDS
def test_a_session_with_floors_looks_for_run_out_leases_once_per_claim_lease_every(
    conn: Conn, connect: ConnectFactory, kinds: bool
) -> None:
    """With floors, a claim looks for expired leases (to reclaim them, or settle those on their last attempt) at
    most once per ``pgjobs.claim_lease_every``: a look per claim read every completed job's old entry whose lease
    would have run out since (sql/claim.sql, _claim_lease_due). A claim inside the window neither reclaims nor
    moves the lease floor; the first claim after it reclaims and settles what ran out meanwhile."""
    floored(conn)
    conn.execute("SET pgjobs.claim_lease_every = '1 hour'")
    extra: dict[str, Any] = {"kind_limits": {"k": 5, "other": 5}} if kinds else {}
    other = connect()
    first = enqueue(other)["id"]
    last = enqueue(other, max_attempts=1)["id"]  # settled (failed) once its lease runs out
    again = enqueue(other, max_attempts=3)["id"]  # reclaimed once its lease runs out
    assert take(conn, kinds=kinds) == [first]  # from the front: it looks, and takes the floors
    floor = state(conn)["q"]["default"]["r"]
    assert {g["id"] for g in claim(other, "gone", max_jobs=5, lease="0.2 seconds")} == {last, again}
    assert claim(conn, "w", max_jobs=5, **extra) == []  # nothing ran out yet: the settle probe takes its floor
    time.sleep(0.5)  # both leases have run out
    assert claim(conn, "w", max_jobs=5, **extra) == []  # inside the window: not looked at
    assert state(conn)["q"]["default"]["r"] == floor, "a claim that did not look keeps the lease floor"
    state_of = "SELECT state::text FROM pgjobs.jobs WHERE id = %s"
    assert conn.execute(state_of, [last]).fetchone() == ("active",)
    conn.execute("SET pgjobs.claim_lease_every = '0'")
    got2 = claim(conn, "w", max_jobs=5, **extra)
    assert [(g["id"], g["attempt"]) for g in got2] == [(again, 2)]
    assert conn.execute(state_of, [last]).fetchone() == ("failed",)
    assert claim(conn, "w", max_jobs=5, **extra) == []
    assert state(conn)["q"]["default"]["r"] > floor, "a look that found none moves the lease floor"


@KINDS
def test_a_priority_job_behind_a_backlog_is_claimed_first(conn: Conn, connect: ConnectFactory, kinds: bool) -> None:
    floored(conn)
    producer = connect()
    enqueue_n(producer, 100)
    with held_snapshot(connect):
        for _ in range(10):
            take(conn, n=3, kinds=kinds)
        urgent = enqueue(producer, priority=-5)["id"]
        later = enqueue(producer, priority=7)["id"]
        assert take(conn, n=1, kinds=kinds) == [urgent]
        expected = first_in_order(conn)
        assert expected != later
        assert take(conn, n=1, kinds=kinds) == [expected]
        # a second urgent level, after this session knows one: still first
        urgent2 = enqueue(producer, priority=-9)["id"]
        assert take(conn, n=2, kinds=kinds)[0] == urgent2


def test_a_rolled_back_claim_is_claimed_again_by_the_safety_net(conn: Conn, connect: ConnectFactory) -> None:
    """Another session's claim locks the first jobs, this session's claim passes them (SKIP LOCKED) and floors
    past them, the other claim rolls back: they are pending again, below the floor. The safety net's scan from
    the front takes them (late, not lost)."""
    floored(conn, every="300 ms")
    producer = connect()
    ids = enqueue_n(producer, 10)
    with held_snapshot(connect):
        take(conn)  # the session's first claim (from the front) takes ids[0] and a floor
        r = connect()
        r.autocommit = False
        assert [g["id"] for g in claim(r, "r", max_jobs=3)] == ids[1:4]
        assert take(conn, n=2) == ids[4:6]
        r.rollback()
        time.sleep(0.5)
        assert take(conn, n=3) == ids[1:4]
        assert take(conn, n=10) == ids[6:]


def test_concurrent_claimers_and_producers_under_a_held_snapshot_claim_each_job_once(connect: ConnectFactory) -> None:
    """Four floored claimers and two producers (current, past and urgent jobs, some from transactions that began
    a while before they insert) race on one queue under a held snapshot: every job is claimed exactly once."""
    per_producer = 300
    claimed: list[list[int]] = [[] for _ in range(4)]
    made: list[list[int]] = [[], []]
    stop = threading.Event()
    errors: list[BaseException] = []

    def producer(i: int) -> None:
        try:
            p = connect()
            for n in range(per_producer // 10):
                spec: dict[str, Any] = {"kind": "k"}
                if n % 5 == 1:
                    spec["run_at"] = PAST
                if n % 7 == 2:
                    spec["priority"] = -1
                if n % 6 == 3:
                    p.autocommit = False
                    p.execute("SELECT now()")
                    time.sleep(0.2)
                rows = call(p, "enqueue_many", jobs=[spec] * 10)
                if not p.autocommit:
                    p.commit()
                    p.autocommit = True
                made[i] += [r["id"] for r in rows]
                time.sleep(0.01)
        except BaseException as exc:  # surfaced by the main thread
            errors.append(exc)

    def claimer(i: int) -> None:
        try:
            c = floored(connect(), every="500 ms")
            while not stop.is_set():
                got = claim(c, f"c{i}", max_jobs=(1, 3, 5, 10)[i], **({"kind_limits": {"k": 10}} if i % 2 else {}))
                if got:
                    scalar(c, "complete_many", ids=[g["id"] for g in got], lease_tokens=[g["lease_token"] for g in got])
                    claimed[i] += [g["id"] for g in got]
                else:
                    time.sleep(0.005)
        except BaseException as exc:
            errors.append(exc)

    with held_snapshot(connect):
        threads = [threading.Thread(target=producer, args=(i,)) for i in range(2)]
        threads += [threading.Thread(target=claimer, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not errors:
            if sum(len(m) for m in made) == 2 * per_producer and sum(len(c) for c in claimed) >= 2 * per_producer:
                break
            time.sleep(0.05)
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors
    everything = [j for c in claimed for j in c]
    assert len(everything) == len(set(everything)), "a job was claimed twice"
    assert sorted(everything) == sorted(j for m in made for j in m), "a job was not claimed"


# -- after a lost race: the walk over dead entries apart from the locking statement ---------------------------


def test_the_retry_of_a_lost_race_starts_its_front_scan_at_the_first_pending_job(
    conn: Conn, connect: ConnectFactory
) -> None:
    """claim() retries a lost race (a job it locked had moved to history) with the walk from the front in a
    statement of its own: the locking statement starts at the first pending job that walk saw, or the floors'
    300 ms margin below the present, and keeps an unbounded range for the more urgent levels below it."""
    old = enqueue_n(conn, 3, run_at=PAST, priority=5)
    with held_snapshot(connect):
        for row in claim(conn, max_jobs=2):  # dead entries at the front, kept by the held snapshot
            call(conn, "complete", id=row["id"], lease_token=row["lease_token"])
        conn.execute("BEGIN")
        conn.execute("SELECT set_config('pgjobs.claim_lost_race', 'on', true)")
        got = conn.execute(
            "SELECT rq, rp, rt[2] = %s::timestamptz, ri, rh FROM pgjobs._claim_floor_plan('{default}', '{default}|*')",
            [PAST],
        ).fetchone()
        assert got is not None
        rq, rp, rt, ri, rh = got
        assert rq == ["default", "default"]
        assert (rp, ri, rh) == ([-32768, 5], [0, old[2]], [5, 32768])  # below level 5, then from the third job
        assert rt is True  # the third job's own run_at: older than the margin
        # a more urgent job filed now is still taken first, then the old one, in claim order
        urgent = enqueue(conn, priority=0)["id"]
        assert [r["id"] for r in claim(conn, max_jobs=5)] == [urgent, old[2]]
        conn.execute("COMMIT")
    assert conn.execute("SELECT current_setting('pgjobs.claim_lost_race', true)").fetchone() in (("",), (None,))


def test_front_ranges_keep_the_floor_margin_for_jobs_of_the_last_300_ms(conn: Conn) -> None:
    """A first pending job filed just now sorts at (level, now() - 300 ms, 0), not at its own key: a producer
    whose transaction began earlier may still commit a job that sorts below it."""
    conn.execute("BEGIN")  # one now() for the job's run_at and the ranges, however slow the machine
    fresh = enqueue(conn, priority=1)["id"]
    got = conn.execute(
        "SELECT rp, ri, rt[2] = now() - interval '300 ms' FROM pgjobs._claim_front_ranges('{default}')"
    ).fetchone()
    conn.execute("COMMIT")
    assert got == ([-32768, 1], [0, 0], True)
    assert fresh > 0
    # a queue with nothing pending keeps the one unbounded range
    assert conn.execute("SELECT rp, rh FROM pgjobs._claim_front_ranges('{empty}')").fetchone() == ([-32768], [32768])


def net_due(conn: Conn) -> None:
    """Makes the safety net due at this session's next claim (its floor state's next full scan, now)."""
    conn.execute(
        "SELECT set_config('pgjobs.claim_floor',"
        " jsonb_set(current_setting('pgjobs.claim_floor')::jsonb, '{n}', '0')::text, false)"
    )


def active_visits(conn: Conn) -> int:
    """Entries of jobs_active_idx this backend's scans returned (live or dead), this transaction included."""
    row = conn.execute("SELECT pg_stat_get_xact_tuples_returned('pgjobs.jobs_active_idx'::regclass)").fetchone()
    assert row is not None
    return int(row[0])


@KINDS
@pytest.mark.parametrize("scan", ["net", "epoch"])
def test_a_scan_from_the_front_walks_old_lease_entries_once(
    conn: Conn, connect: ConnectFactory, kinds: bool, scan: str
) -> None:
    """Under a held snapshot every job completed since leaves its old 'active' entry, and once its lease time has
    passed, a look for run-out leases from the front walks it. A scan from the front (the safety net's, or one
    after the epoch moved: a job filed with an old run_at) looked twice (the settle probe and the claim's reclaim
    branch, both from -infinity); one walk that locks nothing now sets where both start (sql/claim.sql,
    _claim_front_leases)."""
    floored(conn)
    producer = connect()
    n = 300
    enqueue_n(producer, n + 5)
    with held_snapshot(connect):
        got = claim(producer, "gone", max_jobs=n, lease="0.05 seconds")
        assert len(got) == n
        scalar(producer, "complete_many", ids=[g["id"] for g in got], lease_tokens=[g["lease_token"] for g in got])
        time.sleep(0.4)  # every completed job's old lease is now in the past (and past the floors' margin)
        take(conn, kinds=kinds)  # the session's first claim, from the front: floors
        take(conn, kinds=kinds)  # its first settle probe (from the front too: a floor for it)
        old = None
        if scan == "net":
            net_due(conn)
        else:
            old = enqueue(producer, run_at=PAST)["id"]  # the epoch moves
        before = active_visits(conn)
        taken = take(conn, kinds=kinds)
        walked = active_visits(conn) - before
    assert len(taken) == 1 and (old is None or taken == [old]), taken
    assert n <= walked < n + 50, walked


@KINDS
def test_the_safety_net_reclaims_and_settles_leases_below_the_lease_floor(
    conn: Conn, connect: ConnectFactory, kinds: bool
) -> None:
    """Leases that ran out below this session's lease floor with no signal (a claim or renewal whose transaction
    committed long after it began): the safety net's walk from the front finds them, the claim reclaims the one
    with attempts left and settles the one on its last attempt."""
    floored(conn)
    conn.execute("SET pgjobs.claim_lease_every = '0'")
    other = connect()
    first = enqueue(other)["id"]
    again = enqueue(other, max_attempts=3)["id"]
    last = enqueue(other, max_attempts=1)["id"]
    assert take(conn, kinds=kinds) == [first]
    assert {g["id"] for g in claim(other, "gone", max_jobs=5)} == {again, last}
    assert claim(conn, "w", max_jobs=5) == []  # a look that found none: the lease floor moves up to now
    time.sleep(0.4)
    assert claim(conn, "w", max_jobs=5) == []
    # both leases moved an hour into the past behind the session's back (no epoch moved)
    other.execute(
        "UPDATE pgjobs.jobs SET lease_expires_at = now() - interval '1 hour' WHERE id = ANY (%s)", [[again, last]]
    )
    assert claim(conn, "w", max_jobs=5) == [], "below the lease floor: not seen without the net"
    net_due(conn)
    extra: dict[str, Any] = {"kind_limits": {"k": 5, "other": 5}} if kinds else {}
    got = claim(conn, "w", max_jobs=5, **extra)
    assert [(g["id"], g["attempt"]) for g in got] == [(again, 2)]
    row = conn.execute("SELECT state::text FROM pgjobs.jobs WHERE id = %s", [last]).fetchone()
    assert row == ("failed",)

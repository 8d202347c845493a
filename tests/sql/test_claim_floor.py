"""Claims of plain queues under a held snapshot: the exact shared floors of ``sql/claim.sql`` ("Floors").

A foreign session idle in a transaction keeps every dead version newer than its snapshot. A claim that read
``jobs_pending_idx`` from its front would visit every job claimed since. A claim reads from the floor the
previous claim of its key left, lowered to the jobs filed since that claim's snapshot, so what it reads does not
grow with the jobs done since the hold; and every job that becomes claimable below a floor, however long its
transaction was open, is among the filings of the next claim. Nothing here sets a session setting or waits out
a margin: the sessions that claim are plain connections, and "after" is an order of events.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from conftest import ConnectFactory

from tests.helpers.foundation import call, claim, enqueue, enqueue_n, held_snapshot, scalar

Conn = psycopg.Connection[Any]
PAST = "2001-02-03T04:05:06Z"
KINDS = pytest.mark.parametrize("kinds", [False, True], ids=["any_kind", "kind_limits"])


def take(conn: Conn, queue: str = "default", n: int = 1, kinds: bool = False) -> list[int]:
    """Claims (any kind, or through kind_limits) and completes; the ids in claim order."""
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


def index_entries(conn: Conn) -> int:
    """Index entries this backend's scans of every pgjobs index returned (live or dead), this transaction
    included: the claim indexes, jobs_filed_idx and the floor log's."""
    row = conn.execute(
        "SELECT coalesce(sum(pg_stat_get_xact_tuples_returned(i.indexrelid)), 0) FROM pg_index AS i"
        " JOIN pg_class AS c ON c.oid = i.indexrelid WHERE c.relnamespace = 'pgjobs'::regnamespace"
    ).fetchone()
    assert row is not None
    return int(row[0])


def blocks_fetched(conn: Conn) -> int:
    """Buffers this transaction's reads of pgjobs' tables and indexes asked for (hits and reads), but those of
    jobs_filed_idx: a claim probes it once per transaction in progress anywhere in the cluster (its snapshot's
    in-progress list), a cost of what runs beside it (other databases' transactions), not of the jobs done.
    Its entries are counted, as every index's, by index_entries."""
    row = conn.execute(
        "SELECT coalesce(sum(pg_stat_get_xact_blocks_fetched(c.oid)), 0) FROM pg_class AS c"
        " WHERE c.relnamespace = 'pgjobs'::regnamespace AND c.relname <> 'jobs_filed_idx'"
    ).fetchone()
    assert row is not None
    return int(row[0])


def measured_claims(conn: Conn, queue: str, claims: int = 8) -> tuple[int, int, int]:
    """(jobs taken, index entries returned, buffers fetched) by ``claims`` claims of one job in a row (every
    8th claim reads the earliest lease again: eight in a row hold one such read), from the backend's
    statistics of this transaction; each job is completed after its claim."""
    taken = entries = buffers = 0
    for _ in range(claims):
        before, blocks_before = index_entries(conn), blocks_fetched(conn)
        taken += len(claim(conn, "w", queues=[queue], max_jobs=1))
        entries += index_entries(conn) - before
        buffers += blocks_fetched(conn) - blocks_before
        done = conn.execute(
            "SELECT id, lease_token FROM pgjobs.jobs WHERE state = 'active' AND queue = %s AND leased_by = 'w'",
            [queue],
        ).fetchall()
        scalar(conn, "complete_many", ids=[d[0] for d in done], lease_tokens=[d[1] for d in done])
    return taken, entries, buffers


def test_a_claim_reads_the_same_after_1000_and_after_20000_jobs_done_under_a_held_snapshot(
    conn: Conn, connect: ConnectFactory
) -> None:
    """A backlog of 21,500 jobs; under a held snapshot 1,000 are claimed and completed, 16 probe claims of 1 are
    measured, 19,000 more are done, and the probes again: they return the same index entries and fetch the same
    buffers within 10 % (from the front they would read 20,000 dead entries more)."""
    producer = connect()
    for _ in range(43):
        enqueue_n(producer, 500, run_at=PAST)
    conn.execute("ANALYZE pgjobs.jobs")
    measured = {}
    with held_snapshot(connect):
        done = 0
        for target in (1000, 20000):
            while done < target:
                done += len(take(producer, n=100))
            take(conn, n=10)  # this session's plans made, as a worker's are
            # (from the start of a window of the floor log: no rotation, whose TRUNCATE resets this
            # transaction's counters of the slot, falls among the probes)
            conn.execute(
                "SELECT setval('pgjobs.claim_floors_seq', (currval('pgjobs.claim_floors_seq') / 8192 + 1) * 8192)"
            )
            measured[target] = measured_claims(conn, "default", 16)
    (t1, e1, b1), (t2, e2, b2) = measured[1000], measured[20000]
    assert t1 == t2 == 16
    assert e2 <= e1 * 1.1, measured
    assert b2 <= b1 * 1.1, measured


@KINDS
def test_an_enqueue_with_a_past_run_at_is_claimed_first(conn: Conn, connect: ConnectFactory, kinds: bool) -> None:
    producer = connect()
    enqueue_n(producer, 30)
    with held_snapshot(connect):
        take(conn, n=5, kinds=kinds)
        old = enqueue(producer, run_at=PAST)["id"]
        many = call(producer, "enqueue_many", jobs=[{"kind": "k", "run_at": "2002-01-01T00:00:00Z"}])[0]["id"]
        assert take(conn, n=2, kinds=kinds) == [old, many]


def open_transaction(connect: ConnectFactory, body: Callable[[Conn], Any], meanwhile: Callable[[], Any]) -> None:
    """Runs ``body`` in a transaction that began before ``meanwhile`` ran (its now(), the run_at it gives a job,
    is older than everything ``meanwhile`` did) and commits after it."""
    w = connect()
    w.autocommit = False
    w.execute("SELECT now()")
    meanwhile()
    body(w)
    w.commit()


@KINDS
def test_jobs_made_pending_by_an_old_transaction_are_claimed(conn: Conn, connect: ConnectFactory, kinds: bool) -> None:
    """fail (retry now), release and retry give the job run_at = now(): the start of their transaction, which may
    sort below the floor that claims left meanwhile. The next claim takes the job."""
    other = connect()
    ids = enqueue_n(other, 2, max_attempts=3)
    got = {g["id"]: g["lease_token"] for g in claim(other, "other", max_jobs=2)}

    def newer() -> None:  # jobs filed after the transaction began, taken: the floor moves past its now()
        enqueue_n(other, 2)
        assert len(take(conn, n=2, kinds=kinds)) == 2

    with held_snapshot(connect):
        actions: list[tuple[int, Callable[[Conn], Any]]] = [
            (ids[0], lambda w: scalar(w, "fail", id=ids[0], lease_token=got[ids[0]], error="boom", retry_at=PAST)),
            (ids[1], lambda w: scalar(w, "release", id=ids[1], lease_token=got[ids[1]])),
        ]
        for jid, body in actions:
            open_transaction(connect, body, meanwhile=newer)
            assert take(conn, kinds=kinds) == [jid]
        failed = enqueue(other, max_attempts=1)["id"]
        tok = claim(other, "other")[0]["lease_token"]
        assert scalar(other, "fail", id=failed, lease_token=tok, error="x") == "failed"
        open_transaction(connect, lambda w: call(w, "retry", id=failed), meanwhile=newer)
        assert take(conn, kinds=kinds) == [failed]


@KINDS
def test_a_released_dependent_is_claimed_in_order(conn: Conn, connect: ConnectFactory, kinds: bool) -> None:
    """A child waits; when its parent completes it becomes pending with the run_at it was enqueued with."""
    other = connect()
    rows = call(
        other,
        "enqueue_many",
        jobs=[{"kind": "k", "ref": "p", "queue": "parents"}, {"kind": "k", "depends_on": [{"ref": "p"}]}],
    )
    child = rows[1]["id"]
    enqueue_n(other, 5)
    with held_snapshot(connect):
        backlog = take(conn, n=5, kinds=kinds)  # the floor now lies past the child's run_at
        assert len(backlog) == 5 and take(conn, kinds=kinds) == []
        assert take(other, "parents") == [rows[0]["id"]]
        assert first_in_order(conn) == child
        assert take(conn, kinds=kinds) == [child]


@KINDS
def test_a_scheduled_job_promoted_below_the_floor_is_claimed(conn: Conn, connect: ConnectFactory, kinds: bool) -> None:
    """A job scheduled for a moment that has passed when its transaction commits, after claims moved the floor
    past that moment: the claim that promotes it takes it."""
    made: list[int] = []
    enqueue_n(conn, 3)

    def body(w: Conn) -> None:
        row = w.execute("SELECT id, state::text FROM pgjobs.enqueue('k', run_at => now() + interval '1 ms')").fetchone()
        assert row is not None and row[1] == "scheduled"
        made.append(int(row[0]))

    with held_snapshot(connect):
        open_transaction(connect, body, meanwhile=lambda: take(conn, n=3, kinds=kinds))
        assert take(conn, kinds=kinds) == made


@KINDS
def test_reaped_workers_jobs_are_reclaimed(conn: Conn, connect: ConnectFactory, kinds: bool) -> None:
    """reap_workers moves the leases of a gone worker's jobs into the past, below the lease floor."""
    other = connect()
    jid = enqueue(other)["id"]
    call(other, "worker_heartbeat", worker="gone", meta={})
    assert [g["id"] for g in claim(other, "gone", lease="1 hour")] == [jid]
    with held_snapshot(connect):
        open_transaction(
            connect, lambda w: scalar(w, "reap_workers", stale_after="0"), meanwhile=lambda: take(conn, kinds=kinds)
        )
        got = claim(conn, "w", max_jobs=1, **({"kind_limits": {"k": 1, "other": 1}} if kinds else {}))
        assert [(g["id"], g["attempt"]) for g in got] == [(jid, 2)]


@KINDS
def test_leases_moved_into_the_past_are_reclaimed_and_settled(conn: Conn, connect: ConnectFactory, kinds: bool) -> None:
    """Leases moved an hour into the past by any statement (here a bare UPDATE: the trigger files it): the next
    claim reclaims the job with attempts left and settles the one on its last attempt."""
    other = connect()
    first = enqueue(other)["id"]
    again = enqueue(other, max_attempts=3)["id"]
    last = enqueue(other, max_attempts=1)["id"]
    assert take(conn, kinds=kinds) == [first]
    assert {g["id"] for g in claim(other, "gone", max_jobs=5)} == {again, last}
    assert claim(conn, "w", max_jobs=5) == []  # the lease floor: the earliest of their leases
    other.execute(
        "UPDATE pgjobs.jobs SET lease_expires_at = now() - interval '1 hour' WHERE id = ANY (%s)", [[again, last]]
    )
    extra: dict[str, Any] = {"kind_limits": {"k": 5, "other": 5}} if kinds else {}
    got = claim(conn, "w", max_jobs=5, **extra)
    assert [(g["id"], g["attempt"]) for g in got] == [(again, 2)]
    row = conn.execute("SELECT state::text FROM pgjobs.jobs WHERE id = %s", [last]).fetchone()
    assert row == ("failed",)


@KINDS
def test_a_priority_job_behind_a_backlog_is_claimed_first(conn: Conn, connect: ConnectFactory, kinds: bool) -> None:
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
        urgent2 = enqueue(producer, priority=-9)["id"]
        assert take(conn, n=2, kinds=kinds)[0] == urgent2


def test_a_rolled_back_claim_s_jobs_are_taken_by_the_next_claim(conn: Conn, connect: ConnectFactory) -> None:
    """Another session's claim locks the first jobs, this session's claim passes them (SKIP LOCKED); the other
    claim rolls back. Its jobs sorted at or above the floor (the first pending job seen, locked or not), so the
    very next claim takes them, in order."""
    producer = connect()
    ids = enqueue_n(producer, 10)
    with held_snapshot(connect):
        assert take(conn) == ids[:1]
        r = connect()
        r.autocommit = False
        assert [g["id"] for g in claim(r, "r", max_jobs=3)] == ids[1:4]
        assert take(conn, n=2) == ids[4:6]
        r.rollback()
        assert take(conn, n=3) == ids[1:4]
        assert take(conn, n=10) == ids[6:]


def test_a_job_committed_after_a_long_open_transaction_is_taken_by_the_first_claim_after_its_commit(
    connect: ConnectFactory,
) -> None:
    """Under a held snapshot, 16 producer transactions each enqueue a job and stay open 0-2 s before they commit,
    while a steady producer files fresh jobs (which sort after the old ones) and one claimer with room takes and
    completes everything. Each commit and each claim's start draw a ticket from one counter: every held-open job
    is taken by a claim whose ticket comes before the first claim ticket drawn after its commit's ticket."""
    tickets = iter(range(1, 10**9))
    lock = threading.Lock()
    committed: dict[int, int] = {}  # job id -> ticket drawn once its commit returned
    claims: list[tuple[int, list[int]]] = []  # (ticket drawn before the claim began, ids it took)
    errors: list[BaseException] = []
    stop = threading.Event()
    rnd = random.Random(7)
    holds = [rnd.uniform(0, 2) for _ in range(16)]

    def draw() -> int:
        with lock:
            return next(tickets)

    def slow(hold: float) -> None:
        try:
            p = connect()
            p.autocommit = False
            jid = enqueue(p, "k", queue="q")["id"]
            stop.wait(hold)  # the transaction stays open this long: the scenario, not a margin
            p.commit()
            committed[jid] = draw()
        except BaseException as exc:  # surfaced by the main thread
            errors.append(exc)

    def steady() -> None:
        try:
            p = connect()
            while not stop.is_set() and len(committed) < len(holds):
                enqueue_n(p, 5, queue="q")
        except BaseException as exc:
            errors.append(exc)

    def claimer() -> None:
        try:
            c = connect()
            while not stop.is_set():
                ticket = draw()
                got = claim(c, "w", queues=["q"], max_jobs=1000)
                if got:
                    scalar(c, "complete_many", ids=[g["id"] for g in got], lease_tokens=[g["lease_token"] for g in got])
                claims.append((ticket, [g["id"] for g in got]))
        except BaseException as exc:
            errors.append(exc)

    with held_snapshot(connect):
        threads = [threading.Thread(target=slow, args=(h,)) for h in holds]
        threads += [threading.Thread(target=steady), threading.Thread(target=claimer)]
        for t in threads:
            t.start()
        for t in threads[: len(holds)]:
            t.join(30)
        # the claimer runs until two claims started after the last commit
        last = max(committed.values(), default=0)
        while not errors and sum(1 for t, _ in claims if t > last) < 2:
            stop.wait(0.01)
        stop.set()
        for t in threads:
            t.join(30)
    assert not errors, errors
    assert len(committed) == len(holds)
    taken_at = {j: t for t, ids in claims for j in ids}
    for jid, ticket in committed.items():
        first_after = min(t for t, _ in claims if t > ticket)
        assert jid in taken_at, jid
        assert taken_at[jid] <= first_after, (jid, ticket, taken_at[jid], first_after)


def test_concurrent_claimers_and_producers_under_a_held_snapshot_claim_each_job_once(connect: ConnectFactory) -> None:
    """Four claimers (two with kind_limits) and two producers (current, past and urgent jobs, some from
    transactions that stay open a while before they commit) race on one queue under a held snapshot: every job
    is claimed exactly once, and none is left pending."""
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
                    stop.wait(0.2)
                rows = call(p, "enqueue_many", jobs=[spec] * 10)
                if not p.autocommit:
                    p.commit()
                    p.autocommit = True
                made[i] += [r["id"] for r in rows]
        except BaseException as exc:  # surfaced by the main thread
            errors.append(exc)

    def claimer(i: int) -> None:
        try:
            c = connect()
            while not stop.is_set():
                got = claim(c, f"c{i}", max_jobs=(1, 3, 5, 10)[i], **({"kind_limits": {"k": 10}} if i % 2 else {}))
                if got:
                    scalar(c, "complete_many", ids=[g["id"] for g in got], lease_tokens=[g["lease_token"] for g in got])
                    claimed[i] += [g["id"] for g in got]
        except BaseException as exc:
            errors.append(exc)

    with held_snapshot(connect):
        threads = [threading.Thread(target=producer, args=(i,)) for i in range(2)]
        threads += [threading.Thread(target=claimer, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads[:2]:
            t.join(60)
        # quiescence: producers done; the claimers go on until every job is taken or no claim finds more
        for _ in range(6000):
            if errors or sum(len(c) for c in claimed) >= 2 * per_producer:
                break
            stop.wait(0.01)
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors
    everything = [j for c in claimed for j in c]
    assert len(everything) == len(set(everything)), "a job was claimed twice"
    assert sorted(everything) == sorted(j for m in made for j in m), "a job was not claimed"


def test_the_floor_log_s_slots_take_turns_and_keep_the_newest_row_of_every_key(conn: Conn) -> None:
    """Rows go to slot (seq / 8192) % 2; a claim in the second half of a window empties the other slot by
    TRUNCATE after it copied the newest row of each key that has no newer one in the current slot. The
    floors still hold: every job is claimed once, in order."""
    ids = {q: enqueue_n(conn, 6, queue=q) for q in ("a", "b", "c")}
    seq = "SELECT setval('pgjobs.claim_floors_seq', %s)"
    rows = "SELECT slot, queue FROM pgjobs.claim_floors ORDER BY seq, queue"
    assert take(conn, "a") == ids["a"][:1]  # seq 1: slot 0
    conn.execute(seq, [8191])
    assert take(conn, "b") == ids["b"][:1]  # seq 8192: slot 1
    assert take(conn, "a") == ids["a"][1:2]  # seq 8193: slot 1, newer than a's row in slot 0
    conn.execute(seq, [20479])
    assert take(conn, "c") == ids["c"][:1]  # seq 20480: slot 0, in the second half of its window: rotates
    assert conn.execute(rows).fetchall() == [(0, "a"), (0, "b"), (0, "a"), (0, "c")]  # copies keep their seq
    assert conn.execute("SELECT count(*) FROM pgjobs.claim_floors_1").fetchone() == (0,)
    for q in ("a", "b", "c"):
        left = ids[q][2 if q == "a" else 1 :]
        assert take(conn, q, n=10) == left

"""The active ledger of capped queues (``sql/caps.sql``): a queue with ``max_active`` alone is claimed on the
plain floor path, its room read from an insert-only ledger of changes and checkpoints, not from a count over
``jobs_active_idx``.

Each path that moves a job out of 'active' leaves the ledger's count equal to the jobs in state 'active'; many
claimers racing with completions, failures and releases never hold more than ``max_active`` jobs, and every
job runs; under a held snapshot a capped claim reads the same index entries and buffers after 1,000 and after
20,000 jobs done.
"""

from __future__ import annotations

import random
import threading
from typing import Any

import psycopg
import pytest
from conftest import ConnectFactory

from tests.helpers.foundation import call, claim, enqueue_n, expire, held_snapshot, run_threads, scalar
from tests.sql.test_claim_floor import blocks_fetched, index_entries

Conn = psycopg.Connection[Any]
PAST = "2001-02-03T04:05:06Z"


def capped(conn: Conn, queue: str = "cq", max_active: int = 5) -> None:
    call(conn, "configure_queue", queue=queue, max_active=max_active)


def one(got: list[dict[str, Any]]) -> dict[str, Any]:
    """The id and lease token of the first job claimed, as keyword arguments."""
    return {"id": got[0]["id"], "lease_token": got[0]["lease_token"]}


def finish(conn: Conn, got: list[dict[str, Any]]) -> None:
    scalar(conn, "complete_many", ids=[g["id"] for g in got], lease_tokens=[g["lease_token"] for g in got])


def ledger_count(conn: Conn, queue: str = "cq") -> tuple[int, int]:
    """(the ledger's count, the jobs in state 'active'), read in one transaction under the queue's claim lock,
    as a claim reads them."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtextextended('pgjobs.claim:' || %s, 0))", [queue])
        row = conn.execute(
            "SELECT pgjobs._cap_active(%s), (SELECT count(*) FROM pgjobs.jobs WHERE state = 'active' AND queue = %s)",
            [queue, queue],
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def test_every_way_out_of_active_keeps_the_ledger_exact(conn: Conn, connect: ConnectFactory) -> None:
    """Complete, complete_many, fail (retried and final), release, dead_letter, ack_cancel, cancel, a durable
    sleep, a reaped worker, a settled expired lease and a reclaimed one: after each, the count equals
    the jobs in state 'active'."""
    capped(conn, max_active=10)
    enqueue_n(conn, 40, queue="cq", run_at=PAST, max_attempts=2)
    assert ledger_count(conn) == (0, 0)

    def lease(n: int = 1, worker: str = "w") -> list[dict[str, Any]]:
        got = claim(conn, worker, queues=["cq"], max_jobs=n)
        assert len(got) == n, got
        return got

    steps: list[tuple[str, Any]] = [
        ("complete", lambda g: scalar(conn, "complete", id=g[0]["id"], lease_token=g[0]["lease_token"])),
        (
            "complete_many",
            lambda g: scalar(
                conn, "complete_many", ids=[x["id"] for x in g], lease_tokens=[x["lease_token"] for x in g]
            ),
        ),
        ("fail", lambda g: scalar(conn, "fail", id=g[0]["id"], lease_token=g[0]["lease_token"], error="e")),
        ("release", lambda g: scalar(conn, "release", id=g[0]["id"], lease_token=g[0]["lease_token"])),
        ("dead_letter", lambda g: scalar(conn, "dead_letter", **one(g), error="e")),
        ("cancel", lambda g: scalar(conn, "cancel", id=g[0]["id"])),
        (
            "sleep_until",
            lambda g: scalar(conn, "sleep_until", **one(g), name="s", until="2100-01-01T00:00:00Z"),
        ),
    ]
    for name, act in steps:
        got = lease(3 if name == "complete_many" else 1)
        act(got)
        count, truth = ledger_count(conn)
        assert count == truth, (name, count, truth)

    # A cancellation requested, then acknowledged by the worker.
    g = lease()
    scalar(conn, "cancel", id=g[0]["id"])
    scalar(conn, "ack_cancel", id=g[0]["id"], lease_token=g[0]["lease_token"])
    assert ledger_count(conn)[0] == ledger_count(conn)[1]

    # A reaped worker's jobs.
    call(conn, "worker_heartbeat", worker="gone")
    lease(2, worker="gone")
    conn.execute("UPDATE pgjobs.workers SET last_seen = now() - interval '1 hour' WHERE id = 'gone'")
    call(conn, "reap_workers", stale_after="1 minute")
    count, truth = ledger_count(conn)
    assert count == truth, ("reap", count, truth)

    # Expired leases: one reclaimable (requeued by the next capped claim, which may take it again), one out of
    # attempts (settled as failed by the next claim).
    a, b = lease(2)
    conn.execute("UPDATE pgjobs.jobs SET attempt = max_attempts WHERE id = %s", [b["id"]])
    expire(conn, a["id"])
    expire(conn, b["id"])
    before = ledger_count(conn)
    assert before[0] == before[1]
    claim(conn, "w2", queues=["cq"], max_jobs=1)
    count, truth = ledger_count(conn)
    assert count == truth, ("expired", count, truth)
    assert conn.execute("SELECT state FROM pgjobs.jobs WHERE id = %s", [b["id"]]).fetchone() == ("failed",)


def test_a_full_cap_of_expired_leases_frees_its_room(conn: Conn) -> None:
    """max_active 2, both active jobs' leases expired: the next claim takes jobs (the expired ones count until
    they are reclaimed, and the claim reclaims them)."""
    capped(conn, max_active=2)
    enqueue_n(conn, 4, queue="cq", run_at=PAST)
    got = claim(conn, "w", queues=["cq"], max_jobs=5)
    assert len(got) == 2
    assert claim(conn, "w", queues=["cq"], max_jobs=5) == []
    for g in got:
        expire(conn, g["id"])
    again = claim(conn, "w2", queues=["cq"], max_jobs=5)
    assert len(again) == 2
    assert ledger_count(conn) == (2, 2)


def test_racing_claimers_and_finishers_never_pass_the_cap_and_every_job_runs(connect: ConnectFactory) -> None:
    """max_active 5, 600 jobs; 6 claimers (claims of 1-4) whose jobs are completed, failed (retried at once,
    max_attempts 3) or released at random, 2 of them finishing on another connection; in each claim's
    transaction, after the claim (the queue lock still held) the jobs in state 'active' are at most 5, and so
    is every sample of a checker. After quiescence every job has ended and the ledger says 0."""
    setup = connect()
    capped(setup, max_active=5)
    total = 600
    enqueue_n(setup, total, queue="cq", run_at=PAST, max_attempts=3)
    stop = threading.Event()
    seen_max = [0]

    def checker() -> None:
        c = connect()
        while not stop.is_set():
            n = c.execute("SELECT count(*) FROM pgjobs.jobs WHERE state = 'active' AND queue = 'cq'").fetchone()
            assert n is not None
            seen_max[0] = max(seen_max[0], int(n[0]))

    t = threading.Thread(target=checker, daemon=True)
    t.start()

    def claimer(i: int) -> int:
        rnd = random.Random(i)
        c = connect()
        finisher = connect() if i < 2 else c
        worst = 0
        idle = 0
        while idle < 50:
            with c.transaction():
                got = claim(c, f"w{i}", queues=["cq"], max_jobs=rnd.randint(1, 4))
                n = c.execute("SELECT count(*) FROM pgjobs.jobs WHERE state = 'active' AND queue = 'cq'").fetchone()
                assert n is not None
                worst = max(worst, int(n[0]))
            if not got:
                left = c.execute(
                    "SELECT count(*) FROM pgjobs.jobs"
                    " WHERE queue = 'cq' AND state IN ('pending', 'scheduled', 'active')"
                ).fetchone()
                assert left is not None
                idle = idle + 1 if int(left[0]) == 0 else 0
                continue
            for g in got:
                r = rnd.random()
                if r < 0.6:
                    scalar(finisher, "complete", id=g["id"], lease_token=g["lease_token"])
                elif r < 0.8:
                    scalar(finisher, "fail", id=g["id"], lease_token=g["lease_token"], error="x", retry_at=PAST)
                else:
                    scalar(finisher, "release", id=g["id"], lease_token=g["lease_token"])
        return worst

    try:
        worst = run_threads(6, claimer, timeout=300)
    finally:
        stop.set()
        t.join(30)
    assert max(worst) <= 5, worst
    assert seen_max[0] <= 5, seen_max
    assert max(worst) == 5  # the cap was reached: the race was run
    ended = setup.execute(
        "SELECT count(*) FROM pgjobs.jobs WHERE queue = 'cq' AND state IN ('succeeded', 'failed')"
    ).fetchone()
    assert ended == (total,)
    assert ledger_count(setup) == (0, 0)


def measured_capped_claims(conn: Conn, claims: int = 16) -> tuple[int, int, int]:
    """(jobs taken, index entries, buffers) of ``claims`` capped claims of one job, each completed after."""
    taken = entries = buffers = 0
    for _ in range(claims):
        # One transaction around the readings and the claim: a backend's pending statistics are flushed (and
        # the transaction's counters restart) only between transactions, when it has been idle a while.
        with conn.transaction():
            before, blocks_before = index_entries(conn), blocks_fetched(conn)
            got = claim(conn, "w", queues=["cq"], max_jobs=1)
            taken += len(got)
            entries += index_entries(conn) - before
            buffers += blocks_fetched(conn) - blocks_before
        finish(conn, got)
    return taken, entries, buffers


def test_a_capped_claim_reads_the_same_after_1000_and_after_20000_jobs_done_under_a_held_snapshot(
    conn: Conn, connect: ConnectFactory
) -> None:
    """max_active 5, a backlog of 21,500 jobs; under a held snapshot 1,000 are claimed (5 at a time) and
    completed, 16 probe claims of 1 are measured, 19,000 more are done, and the probes again: the same index
    entries and buffers within 10 % (a count over jobs_active_idx would pass 19,000 dead entries more)."""
    capped(conn, max_active=5)
    producer = connect()
    for _ in range(43):
        enqueue_n(producer, 500, queue="cq", run_at=PAST)
    conn.execute("ANALYZE pgjobs.jobs")
    measured = {}
    with held_snapshot(connect):
        done = 0
        for target in (1000, 20000):
            while done < target:
                got = claim(producer, "p", queues=["cq"], max_jobs=5)
                finish(producer, got)
                done += len(got)
            measured_capped_claims(conn, 4)  # this session's plans made, as a worker's are
            measured[target] = measured_capped_claims(conn, 64)
    (t1, e1, b1), (t2, e2, b2) = measured[1000], measured[20000]
    assert t1 == t2 == 64
    assert e2 <= e1 * 1.1, measured
    assert b2 <= b1 * 1.1, measured


@pytest.mark.parametrize(
    "settings",
    [{"max_active": 1}, {"fair": True, "max_active_per_group": 1}],
    ids=["max_active", "fair-per-group"],
)
def test_a_cap_set_while_a_job_ends_waits_for_it_and_counts_it(
    conn: Conn, connect: ConnectFactory, settings: dict[str, Any]
) -> None:
    """A job of an uncounted queue ends in a transaction still open when ``max_active`` (or fairness with a
    per-group cap: a ledger per group) is set: the ledger's triggers filed nothing for it (no ledger when its
    statement ran). configure_queue waits for that transaction, so the first count, after both, is exact;
    without the wait it counted the job as active for good."""
    enqueue_n(conn, 2, queue="cq", run_at=PAST, group_key="g")
    got = claim(conn, "w", queues=["cq"], max_jobs=2)
    assert len(got) == 2
    ender = connect()
    ender.execute("BEGIN")
    ender.execute("SELECT pgjobs.complete(%s, %s)", [got[0]["id"], got[0]["lease_token"]])
    admin = connect()
    done = threading.Event()

    def configure() -> None:
        call(admin, "configure_queue", queue="cq", **settings)
        done.set()

    t = threading.Thread(target=configure)
    t.start()
    seen = False
    for _ in range(200):  # until the configure call has ended or is seen waiting for its lock
        seen = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE relation = 'pgjobs.jobs'::regclass AND mode = 'ShareLock'"
            " AND NOT granted"
        ).fetchone() == (1,)
        if seen or done.is_set():
            break
        threading.Event().wait(0.05)
    if done.is_set():  # (no wait: the cap's first count now, while the ended job's transaction is open)
        ledger_count(conn)
    ender.execute("COMMIT")
    t.join(10)
    assert done.is_set()
    assert ledger_count(conn) == (1, 1)
    assert seen
    finish(conn, got[1:])
    assert ledger_count(conn) == (0, 0)
    enqueue_n(conn, 2, queue="cq", run_at=PAST, group_key="g")
    assert len(claim(conn, "w", queues=["cq"], max_jobs=5)) == 1  # the cap of 1 has its room, and no more

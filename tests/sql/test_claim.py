"""Claiming work: pgjobs.claim (order, SKIP LOCKED, reclaim of expired leases, kind_limits, paused queues)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from conftest import ConnectFactory

from tests.helpers.foundation import (
    call,
    claim,
    claim_one,
    count,
    enqueue,
    enqueue_n,
    expire,
    job,
    run_threads,
    scalar,
)

Conn = psycopg.Connection[Any]
FUTURE = datetime.now(UTC) + timedelta(days=365)


def make_due(conn: Conn, id: int, seconds_ago: float = 1) -> None:
    """A scheduled job whose run_at has come (instead of sleeping until it does)."""
    conn.execute(
        "UPDATE pgjobs.jobs SET run_at = now() - make_interval(secs => %s) WHERE id = %s AND state = 'scheduled'",
        [seconds_ago, id],
    )


@pytest.mark.smoke
def test_claim_leases_a_job(conn: Conn) -> None:
    e = enqueue(conn, "k", payload={"x": 1}, meta={"t": 1}, group_key="g", max_attempts=7)
    c = claim_one(conn, "worker-1", lease=timedelta(minutes=5))
    assert (c["id"], c["kind"], c["queue"], c["payload"], c["meta"]) == (e["id"], "k", "default", {"x": 1}, {"t": 1})
    assert (c["attempt"], c["max_attempts"], c["group_key"], c["batch_id"], c["checkpoint"]) == (1, 7, "g", None, None)
    row = job(conn, e["id"])
    assert row["state"] == "active" and row["leased_by"] == "worker-1"
    assert row["lease_token"] == c["lease_token"] and row["lease_expires_at"] == c["lease_expires_at"]
    now = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    assert c["lease_expires_at"] > now + timedelta(minutes=4)
    assert c["first_started_at"] is not None and row["first_started_at"] == c["first_started_at"]
    assert claim(conn) == []  # nothing else to take


def test_claim_order_is_priority_then_run_at_then_id(conn: Conn) -> None:
    t0 = datetime(2025, 1, 1, tzinfo=UTC)
    ids = {
        "p1_late": enqueue(conn, priority=1, run_at=t0 + timedelta(minutes=2))["id"],
        "p0_late": enqueue(conn, priority=0, run_at=t0 + timedelta(minutes=2))["id"],
        "p0_early": enqueue(conn, priority=0, run_at=t0)["id"],
        "pneg": enqueue(conn, priority=-3, run_at=t0 + timedelta(minutes=9))["id"],
        "p0_late_2": enqueue(conn, priority=0, run_at=t0 + timedelta(minutes=2))["id"],  # same run_at: id
    }
    # due scheduled jobs and pending jobs share one order
    sched_hi = enqueue(conn, priority=-1, run_at=FUTURE)["id"]
    sched_lo = enqueue(conn, priority=5, run_at=FUTURE)["id"]
    make_due(conn, sched_lo, 7200)
    make_due(conn, sched_hi, 1)
    order = [claim_one(conn)["id"] for _ in range(7)]
    assert order == [
        ids["pneg"],
        sched_hi,
        ids["p0_early"],
        ids["p0_late"],
        ids["p0_late_2"],
        ids["p1_late"],
        sched_lo,
    ]


def test_a_due_scheduled_job_of_better_priority_comes_first(conn: Conn) -> None:
    """Regression: due scheduled candidates were read by run_at only, so an earlier low-priority one won."""
    low = enqueue(conn, priority=5, run_at=FUTURE)["id"]
    high = enqueue(conn, priority=0, run_at=FUTURE)["id"]
    make_due(conn, low, 60)
    make_due(conn, high, 1)
    assert claim_one(conn)["id"] == high


def test_multi_job_claim_returns_jobs_in_claim_order(conn: Conn) -> None:
    a = enqueue(conn, priority=2)["id"]
    b = enqueue(conn, priority=1)["id"]
    c = enqueue(conn, priority=3)["id"]
    d = enqueue(conn, priority=1)["id"]
    got = claim(conn, max_jobs=3)
    assert [g["id"] for g in got] == [b, d, a]
    assert len({g["lease_token"] for g in got}) == 3
    assert [g["id"] for g in claim(conn, max_jobs=10)] == [c]


def test_claim_order_across_several_queues(conn: Conn) -> None:
    t0 = datetime(2025, 1, 1, tzinfo=UTC)
    a = enqueue(conn, queue="a", priority=1, run_at=t0)["id"]
    b = enqueue(conn, queue="b", priority=0, run_at=t0 + timedelta(seconds=5))["id"]
    c = enqueue(conn, queue="c", priority=0, run_at=t0)["id"]
    enqueue(conn, queue="elsewhere", priority=-9)
    got = claim(conn, queues=["a", "b", "c"], max_jobs=10)
    assert [g["id"] for g in got] == [c, b, a]
    assert [g["id"] for g in claim(conn, queues=["a", "b", "c", "a"], max_jobs=10)] == []


def test_future_scheduled_jobs_are_not_claimed_until_due(conn: Conn) -> None:
    jid = enqueue(conn, run_at=FUTURE)["id"]
    assert claim(conn) == []
    make_due(conn, jid)
    c = claim_one(conn)
    assert c["id"] == jid and c["attempt"] == 1


@pytest.mark.smoke
def test_four_concurrent_claimers_over_1000_jobs_claim_each_once(connect: ConnectFactory) -> None:
    setup = connect()
    ids = enqueue_n(setup, 1000, "bulk")
    conns = [connect() for _ in range(4)]
    seen: list[list[int]] = [[] for _ in range(4)]

    def worker(i: int) -> None:
        c = conns[i]
        size = (1, 7, 25, 50)[i]
        while True:
            got = claim(c, f"w{i}", max_jobs=size)
            if not got:
                return
            seen[i] += [g["id"] for g in got]
            done = scalar(c, "complete_many", ids=[g["id"] for g in got], lease_tokens=[g["lease_token"] for g in got])
            assert done == len(got)

    run_threads(4, worker, timeout=120)
    claimed = [jid for s in seen for jid in s]
    assert len(claimed) == len(set(claimed)), "a job was claimed twice"
    assert sorted(claimed) == sorted(ids), "a job was missed"
    assert count(setup, "state = 'succeeded'") == 1000
    assert claim(setup) == []


def test_claimers_skip_locked_jobs_instead_of_waiting(connect: ConnectFactory) -> None:
    setup = connect()
    first, second = enqueue(setup)["id"], enqueue(setup)["id"]
    holder = connect(autocommit=False)
    assert claim_one(holder, "a")["id"] == first  # not committed: the row stays locked
    other = connect()
    other.execute("SET lock_timeout = '2s'")
    assert claim_one(other, "b")["id"] == second  # passed the locked row, never waited on it
    assert claim(other, "b") == []
    holder.commit()
    assert job(setup, first)["leased_by"] == "a"


def test_an_expired_lease_is_reclaimed(conn: Conn) -> None:
    jid = enqueue(conn, max_attempts=5)["id"]
    c1 = claim_one(conn, "dead-worker")
    assert scalar(conn, "checkpoint", id=jid, lease_token=c1["lease_token"], checkpoint={"page": 3}) is True
    first_started = job(conn, jid)["first_started_at"]
    assert claim(conn) == []  # lease still holds
    expire(conn, jid)
    c2 = claim_one(conn, "new-worker")
    assert c2["id"] == jid and c2["attempt"] == 2
    assert c2["checkpoint"] == {"page": 3}
    assert c2["first_started_at"] == first_started
    assert c2["lease_token"] != c1["lease_token"]
    row = job(conn, jid)
    assert row["leased_by"] == "new-worker" and row["state"] == "active"
    assert row["errors"][-1]["attempt"] == 1 and row["last_error"] == "lease expired"
    # the old holder's token no longer holds the job
    assert scalar(conn, "complete", id=jid, lease_token=c1["lease_token"]) is False
    assert scalar(conn, "complete", id=jid, lease_token=c2["lease_token"]) is True


def test_an_expired_lease_on_the_last_attempt_ends_failed(conn: Conn) -> None:
    jid = enqueue(conn, max_attempts=1)["id"]
    claim_one(conn)
    expire(conn, jid)
    assert claim(conn) == []
    row = job(conn, jid)
    assert row["state"] == "failed" and row["completed_at"] is not None and row["lease_token"] is None


def test_a_cancel_requested_job_whose_lease_expired_ends_cancelled(conn: Conn) -> None:
    jid = enqueue(conn)["id"]
    claim_one(conn)
    assert scalar(conn, "cancel", id=jid) is True
    expire(conn, jid)
    assert claim(conn) == []
    assert job(conn, jid)["state"] == "cancelled"


@pytest.mark.smoke
def test_paused_queues_give_nothing(conn: Conn) -> None:
    p = enqueue(conn, queue="paused")["id"]
    o = enqueue(conn, queue="open")["id"]
    call(conn, "configure_queue", queue="paused", paused=True)
    assert claim(conn, queues=["paused"]) == []
    assert [c["id"] for c in claim(conn, queues=["paused", "open"], max_jobs=5)] == [o]
    # an expired lease in a paused queue is not reclaimed either
    call(conn, "configure_queue", queue="paused", paused=False)
    assert claim_one(conn, queues=["paused"])["id"] == p
    expire(conn, p)
    call(conn, "configure_queue", queue="paused", paused=True)
    assert claim(conn, queues=["paused"]) == []
    call(conn, "configure_queue", queue="paused", paused=False)
    assert claim_one(conn, queues=["paused"])["attempt"] == 2


def test_kind_limits_null_takes_any_kind(conn: Conn) -> None:
    enqueue(conn, "a")
    enqueue(conn, "b")
    assert sorted(c["kind"] for c in claim(conn, max_jobs=5, kind_limits=None)) == ["a", "b"]


def test_kind_limits_takes_only_listed_kinds_at_most_n_each(conn: Conn) -> None:
    for kind in ("a", "a", "a", "b", "b", "b", "c", "c"):
        enqueue(conn, kind)
    got = claim(conn, max_jobs=10, kind_limits={"a": 2, "b": 1})
    kinds = sorted(c["kind"] for c in got)
    assert kinds == ["a", "a", "b"]
    assert claim(conn, max_jobs=10, kind_limits={"zzz": 5}) == []
    assert claim(conn, max_jobs=10, kind_limits={}) == []
    assert claim(conn, max_jobs=10, kind_limits={"c": 0}) == []
    assert sorted(c["kind"] for c in claim(conn, max_jobs=10, kind_limits={"c": 5})) == ["c", "c"]


def test_kind_limits_fill_the_claim_when_one_kind_comes_first(conn: Conn) -> None:
    """Regression: the first kind in claim order crowded the other listed kinds out of the candidates."""
    for _ in range(3):
        enqueue(conn, "x")
    for _ in range(3):
        enqueue(conn, "y")
    got = claim(conn, max_jobs=4, kind_limits={"x": 1, "y": 3})
    assert sorted(c["kind"] for c in got) == ["x", "y", "y", "y"]


def test_kind_limits_accept_integral_json_numbers(conn: Conn) -> None:
    enqueue(conn, "x")
    enqueue(conn, "x")
    enqueue(conn, "x")
    got = conn.execute("SELECT id FROM pgjobs.claim(worker => 'w', max_jobs => 5, kind_limits => '{\"x\": 2.0}')")
    assert len(got.fetchall()) == 2
    got = conn.execute("SELECT id FROM pgjobs.claim(worker => 'w', max_jobs => 5, kind_limits => '{\"x\": 1e9}')")
    assert len(got.fetchall()) == 1


def test_kind_limits_apply_to_reclaims_too(conn: Conn) -> None:
    jid = enqueue(conn, "x")["id"]
    claim_one(conn)
    expire(conn, jid)
    assert claim(conn, kind_limits={"y": 1}) == []
    assert claim_one(conn, kind_limits={"x": 1})["attempt"] == 2


def test_max_jobs_bounds_the_claim(conn: Conn) -> None:
    enqueue_n(conn, 5)
    assert len(claim(conn, max_jobs=2)) == 2
    assert len(claim(conn, max_jobs=100)) == 3


def test_claim_does_not_wait_on_a_concurrent_enqueue(connect: ConnectFactory) -> None:
    producer = connect(autocommit=False)
    enqueue(producer, "uncommitted")
    consumer = connect()
    assert claim(consumer) == []  # invisible until commit, and no wait
    producer.commit()
    assert claim_one(consumer)["kind"] == "uncommitted"


def test_concurrent_claimers_and_reclaims_never_share_a_job(connect: ConnectFactory) -> None:
    """Leases expiring while claimers race: every claim of a job has a distinct attempt number."""
    setup = connect()
    ids = enqueue_n(setup, 60, max_attempts=50)
    conns = [connect() for _ in range(4)]
    lock = threading.Lock()
    attempts: dict[int, list[int]] = {}

    def worker(i: int) -> None:
        c = conns[i]
        for round_ in range(6):
            got = claim(c, f"w{i}", max_jobs=5)
            with lock:
                for g in got:
                    attempts.setdefault(g["id"], []).append(g["attempt"])
            if round_ % 2 == 0 and got:
                c.execute(
                    "UPDATE pgjobs.jobs SET lease_expires_at = now() - interval '1s' WHERE id = ANY(%s)",
                    [[g["id"] for g in got]],
                )

    run_threads(4, worker)
    for jid, seen in attempts.items():
        assert sorted(seen) == list(range(1, len(seen) + 1)), (jid, seen)
    assert set(attempts) <= set(ids)

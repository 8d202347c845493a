"""Lease renewal racing the calls that end attempts, on real connections.

The worker renews every job it holds in one ``renew_leases`` while its completer ends some of the same jobs in
one ``complete_many``: the renewal's list is in claim order, the completion's in finishing order, so two
multi-row statements lock overlapping rows in opposite orders. Before the fix that was a deadlock (40P01) that
PostgreSQL broke by failing one of them; the soak benchmark logged them. Now ``renew_leases`` never waits for a
row lock (SKIP LOCKED: a job busy in another transaction is reported with ``cancel_requested`` NULL, not
renewed and not lost), and every multi-row statement that waits (``complete_many``, ``reap_workers``) locks
its rows in id order.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any
from uuid import UUID

import anyio
import psycopg
import pytest
from psycopg.types.json import Jsonb

import pgjobs
from tests.conftest import ConnectFactory

Conn = psycopg.Connection[Any]


def claim(conn: Conn, n: int, worker: str = "w") -> list[tuple[int, UUID]]:
    rows = conn.execute(
        "SELECT id, lease_token FROM pgjobs.claim(worker => %s, queues => '{default}', max_jobs => %s)", [worker, n]
    ).fetchall()
    return [(int(r[0]), r[1]) for r in rows]


def enqueue_many(conn: Conn, n: int, **spec: Any) -> list[int]:
    rows = conn.execute("SELECT id FROM pgjobs.enqueue_many(%s)", [Jsonb([{"kind": "k", **spec}] * n)]).fetchall()
    return [int(r[0]) for r in rows]


def renew(conn: Conn, pairs: list[tuple[int, UUID]], lease: str = "30 seconds") -> dict[int, bool | None]:
    """id -> cancel_requested of the jobs renewed, None for a busy one (renewed false; its cancel_requested is
    never NULL)."""
    rows = conn.execute(
        "SELECT id, cancel_requested, renewed FROM pgjobs.renew_leases(%s::bigint[], %s::uuid[], %s::interval)",
        [[p[0] for p in pairs], [p[1] for p in pairs], lease],
    ).fetchall()
    assert all(r[1] is not None for r in rows)
    return {int(r[0]): (r[1] if r[2] else None) for r in rows}


def complete_many(conn: Conn, pairs: list[tuple[int, UUID]]) -> int:
    row = conn.execute(
        "SELECT pgjobs.complete_many(%s::bigint[], %s::uuid[])", [[p[0] for p in pairs], [p[1] for p in pairs]]
    ).fetchone()
    assert row is not None
    return int(row[0])


def race(*loops: Callable[[], None]) -> list[BaseException]:
    """Runs the loops in threads started together; returns what they raised."""
    errors: list[BaseException] = []
    start = threading.Barrier(len(loops))

    def run(loop: Callable[[], None]) -> None:
        try:
            start.wait(10)
            loop()
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(loop,)) for loop in loops]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a racing thread hung"
    return errors


def _renew_end_round(
    renewer: Conn, completer: Conn, failer: Conn, held: list[tuple[int, UUID]], renew_ascending: bool
) -> tuple[int, int]:
    """One round: ``held`` renewed again and again in one order while the completer and the failer end every job
    in the opposite order. Returns (completed, failed); asserts nothing failed and no held job was left out."""
    renew_order = held if renew_ascending else held[::-1]
    end_order = held[::-1] if renew_ascending else held
    to_fail = [p for i, p in enumerate(end_order) if i % 7 == 3]
    to_complete = [p for p in end_order if p not in to_fail]
    ending: set[int] = set()  # ids whose end was sent (added before the call goes out)
    ended = {"completed": 0, "failed": 0}
    lock = threading.Lock()
    finished = threading.Event()
    omitted: list[tuple[set[int], set[int]]] = []  # (left out of an answer, ids being ended by then)

    def renew_loop() -> None:
        while not finished.is_set():
            got = renew(renewer, renew_order)
            with lock:
                seen = set(ending)
            omitted.append(({p[0] for p in renew_order} - set(got), seen))

    def complete_loop() -> None:
        try:
            for i in range(0, len(to_complete), 9):
                chunk = to_complete[i : i + 9]
                with lock:
                    ending.update(p[0] for p in chunk)
                ended["completed"] += complete_many(completer, chunk)
        finally:
            finished.set()

    def fail_loop() -> None:
        for job_id, token in to_fail:
            with lock:
                ending.add(job_id)
            state = failer.execute("SELECT pgjobs.fail(%s, %s, 'boom')", [job_id, token]).fetchone()
            assert state == ("failed",)
            ended["failed"] += 1

    errors = race(renew_loop, complete_loop, fail_loop)
    assert not errors, f"racing calls failed: {errors!r}"
    assert ended == {"completed": len(to_complete), "failed": len(to_fail)}
    assert omitted, "the renewer never ran"
    for left_out, being_ended in omitted:
        assert left_out <= being_ended, f"renewal reported {sorted(left_out - being_ended)} lost while held"
    return ended["completed"], ended["failed"]


@pytest.mark.parametrize("renew_ascending", [True, False], ids=["renew-ascending", "renew-descending"])
def test_renewal_and_completion_of_overlapping_jobs_in_opposite_orders_never_deadlock(
    conn: Conn, connect: ConnectFactory, renew_ascending: bool
) -> None:
    """Rounds of 120 running jobs: one connection renews all of them again and again in one order while two
    others end them in the opposite order (complete_many in chunks, fail one at a time). No call fails, every
    job ends exactly once, and a renewal leaves out only jobs whose end had already been sent."""
    renewer, completer, failer = connect(), connect(), connect()
    rounds, per_round = 12, 120
    enqueue_many(conn, rounds * per_round, max_attempts=1)
    totals = [0, 0]
    for _ in range(rounds):
        held = sorted(claim(conn, per_round))
        assert len(held) == per_round
        completed, failed = _renew_end_round(renewer, completer, failer, held, renew_ascending)
        totals = [totals[0] + completed, totals[1] + failed]
    states = dict(conn.execute("SELECT state::text, count(*) FROM pgjobs.jobs GROUP BY 1").fetchall())
    assert states == {"succeeded": totals[0], "failed": totals[1]}
    assert totals[1] > 0 and sum(totals) == rounds * per_round


def test_a_busy_job_is_reported_as_not_renewed_without_waiting_and_not_as_lost(
    conn: Conn, connect: ConnectFactory
) -> None:
    """A job whose row another transaction holds (its completion on the way, a cancel, a checkpoint) is in the
    answer with renewed false: not renewed this time, not lost; the renewal does not wait for it. Once
    the completion commits, the job is left out (the lease is gone: it ended); after a rollback it renews."""
    enqueue_many(conn, 3)
    (a, ta), (b, tb), (c, tc) = sorted(claim(conn, 3))
    before = dict(conn.execute("SELECT id, lease_expires_at FROM pgjobs.jobs").fetchall())
    holder = connect(autocommit=False)
    assert holder.execute("SELECT pgjobs.complete(%s, %s)", [b, tb]).fetchone() == (True,)
    renewer = connect()
    renewer.execute("SET lock_timeout = '5s'")  # a renewal that waited for b would fail here, not hang
    t0 = time.monotonic()
    assert renew(renewer, [(a, ta), (b, tb), (c, tc)], "1 hour") == {a: False, b: None, c: False}
    assert time.monotonic() - t0 < 5
    after = dict(conn.execute("SELECT id, lease_expires_at FROM pgjobs.jobs").fetchall())
    assert after[a] > before[a] and after[c] > before[c] and after[b] == before[b]
    holder.commit()
    assert renew(renewer, [(a, ta), (b, tb), (c, tc)]) == {a: False, c: False}

    # a rolled-back end leaves the job held: renewed again next time
    assert holder.execute("SELECT pgjobs.fail(%s, %s, 'x')", [c, tc]).fetchone() is not None
    assert renew(renewer, [(a, ta), (c, tc)]) == {a: False, c: None}
    holder.rollback()
    assert renew(renewer, [(a, ta), (c, tc)]) == {a: False, c: False}

    # a requested cancellation is reported as before (and a busy row reports none until it is free)
    assert conn.execute("SELECT pgjobs.cancel(%s)", [a]).fetchone() == (True,)
    assert renew(renewer, [(a, ta), (c, tc)]) == {a: True, c: False}


def _reap_complete_round(reaper: Conn, completer: Conn, held: list[tuple[int, UUID]]) -> int:
    finished = threading.Event()
    completed = [0]

    def reap_loop() -> None:
        while not finished.is_set():
            reaper.execute("SELECT pgjobs.worker_heartbeat('w', '{}')")
            reaper.execute("SELECT pgjobs.reap_workers(stale_after => '0')")

    def complete_loop() -> None:
        try:
            for i in range(0, len(held), 10):
                completed[0] += complete_many(completer, held[i : i + 10])
        finally:
            finished.set()

    errors = race(reap_loop, complete_loop)
    assert not errors, f"racing calls failed: {errors!r}"
    return completed[0]


def test_reaping_and_completing_the_same_jobs_never_deadlock(conn: Conn, connect: ConnectFactory) -> None:
    """reap_workers (after an outage every live worker looks stale) expires the leases of a worker's jobs while
    that worker completes them in an order of its own: no deadlock, every job ends once (the tokens stay
    through the reap, so the completions still count)."""
    reaper, completer = connect(), connect()
    rounds, per_round = 10, 150
    enqueue_many(conn, rounds * per_round)
    for _ in range(rounds):
        conn.execute("SELECT pgjobs.worker_heartbeat('w', '{}')")
        held = claim(conn, per_round)
        random.shuffle(held)
        assert _reap_complete_round(reaper, completer, held) == per_round
    assert conn.execute("SELECT count(*) FILTER (WHERE state = 'succeeded'), count(*) FROM pgjobs.jobs").fetchone() == (
        rounds * per_round,
        rounds * per_round,
    )


# ------------------------------------------------------------------------------ the worker and lost races

# Real faults, injected by the database: a trigger on pgjobs.jobs fails the first N statements of each kind with
# the SQLSTATE of a lost race. The counters are sequences (nextval is not rolled back with the failed statement).
FAULTS_SQL = """
CREATE SEQUENCE public.fault_claim; CREATE SEQUENCE public.fault_renew; CREATE SEQUENCE public.fault_complete;
CREATE SEQUENCE public.fault_fail; CREATE SEQUENCE public.fault_checkpoint;
CREATE FUNCTION public.lost_race() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_op text;
BEGIN
    v_op := CASE
        WHEN OLD.state IN ('pending', 'scheduled') AND NEW.state = 'active' THEN 'claim'
        WHEN OLD.state = 'active' AND NEW.state = 'active' AND NEW.lease_token = OLD.lease_token
             AND NEW.lease_expires_at > OLD.lease_expires_at THEN 'renew'
        WHEN OLD.state = 'active' AND NEW.state = 'succeeded' THEN 'complete'
        WHEN OLD.state = 'active' AND NEW.state IN ('failed', 'scheduled', 'pending') AND NEW.lease_token IS NULL
             AND NEW.last_error IS NOT NULL THEN 'fail'
        WHEN NEW.checkpoint IS DISTINCT FROM OLD.checkpoint THEN 'checkpoint'
    END;
    IF v_op IS NOT NULL AND nextval('public.fault_' || v_op) <= 3 THEN
        RAISE EXCEPTION USING ERRCODE = CASE WHEN v_op IN ('complete', 'checkpoint') THEN '40P01' ELSE '40001' END,
            MESSAGE = format('injected lost race in %s of job %s', v_op, NEW.id);
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER lost_race BEFORE UPDATE ON pgjobs.jobs FOR EACH ROW EXECUTE FUNCTION public.lost_race();
"""


def test_the_worker_runs_again_every_call_that_lost_a_race(
    dsn: str, conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    """Claim, renewal, completion, fail and checkpoint each fail three times with 40001 or 40P01 (a deadlock, or
    a row moved to another partition under the statement): the worker runs each call again, does not crash, and
    every job ends once, on its first attempt (no lease lapsed into a second run, no outcome dropped). A lost
    race is no outage: psycopg makes both errors OperationalErrors, and the worker used to take them for a lost
    connection (reconnecting, holding off the reaping, giving up on a stopping worker's completions)."""
    caplog.set_level(logging.DEBUG, logger="pgjobs.worker")
    app = pgjobs.App()

    @app.job("ok")
    async def ok(payload: Any, ctx: pgjobs.JobContext) -> str:
        return "ok"

    @app.job("boom")
    async def boom(payload: Any, ctx: pgjobs.JobContext) -> None:
        raise RuntimeError("boom")

    @app.job("slow")
    async def slow(payload: Any, ctx: pgjobs.JobContext) -> str:
        await ctx.save_checkpoint({"half": True})
        await anyio.sleep(2.0)  # several renewals (lease 1.5 s: one every 0.5 s), the first three fail
        return "slow"

    conn.execute(FAULTS_SQL)
    for kind, n in (("slow", 3), ("ok", 40), ("boom", 4)):
        conn.execute("SELECT count(*) FROM pgjobs.enqueue_many(%s)", [Jsonb([{"kind": kind, "max_attempts": 1}] * n)])
    worker = pgjobs.Worker(app, dsn, {"default": 10}, lease=1.5, scheduler=False, poll_interval=0.5)

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            with anyio.fail_after(60):
                while conn.execute(
                    "SELECT count(*) FROM pgjobs.jobs WHERE state NOT IN ('succeeded', 'failed')"
                ).fetchone() != (0,):
                    await anyio.sleep(0.05)
            worker.stop()

    anyio.run(main)
    rows = conn.execute("SELECT kind, state::text, attempt, count(*) FROM pgjobs.jobs GROUP BY 1, 2, 3").fetchall()
    assert sorted(rows) == [("boom", "failed", 1, 4), ("ok", "succeeded", 1, 40), ("slow", "succeeded", 1, 3)]
    for op in ("claim", "renew", "complete", "fail", "checkpoint"):
        used = conn.execute(f"SELECT last_value FROM public.fault_{op}").fetchone()
        assert used is not None and used[0] > 3, f"the {op} fault never fired past its three failures"
    # The 40001s (claim, renewal, fail) are run again inside SQL, where a lost race on a row still held is
    # retried (sql/history.sql, ROW MOVEMENT): the worker sees the 40P01s (completion, checkpoint), 3 each.
    assert worker.transient_retries >= 6
    raced = [r.getMessage() for r in caplog.records if "lost a race" in r.getMessage()]
    assert len(raced) == worker.transient_retries
    assert all(("40001" in m) != ("40P01" in m) for m in raced), raced
    outage = [r.getMessage() for r in caplog.records if getattr(r, "source", None) or "unreachable" in r.getMessage()]
    assert not outage, outage
    assert worker.stats.lost == 0
    assert conn.execute("SELECT count(*) FROM pgjobs.jobs WHERE checkpoint IS NOT NULL").fetchone() == (3,)


def _complete_twice_round(first: Conn, second: Conn, held: list[tuple[int, UUID]]) -> list[int]:
    done = [0, 0]

    def ascending() -> None:
        done[0] += complete_many(first, held)

    def descending() -> None:
        done[1] += complete_many(second, held[::-1])

    errors = race(ascending, descending)
    assert not errors, f"racing calls failed: {errors!r}"
    return done


def test_two_completions_of_the_same_jobs_in_opposite_orders_never_deadlock(
    conn: Conn, connect: ConnectFactory
) -> None:
    """A completion sent twice (a retry after a lost reply while the first is still running, a client's own
    complete_many) over the same jobs in opposite orders: complete_many locks in id order whatever the order
    of its arrays, so one waits for the other; each job is completed once between them."""
    first, second = connect(), connect()
    rounds, per_round = 30, 300
    enqueue_many(conn, rounds * per_round)
    for _ in range(rounds):
        held = sorted(claim(conn, per_round))
        done = _complete_twice_round(first, second, held)
        assert sum(done) == per_round, done
    assert conn.execute("SELECT count(*) FROM pgjobs.jobs WHERE state = 'succeeded'").fetchone() == (
        rounds * per_round,
    )


def _cancel_complete_round(
    canceller: Conn, completer: Conn, batch: int, held: list[tuple[int, UUID]], delay: float
) -> int:
    done = [0]

    def cancel() -> None:
        time.sleep(max(0.0, delay))  # varied: the two statements meet at different points of their lists
        canceller.execute("SELECT pgjobs.cancel_batch(%s)", [batch]).fetchone()

    def complete() -> None:
        time.sleep(max(0.0, -delay))
        done[0] += complete_many(completer, held[::-1])

    errors = race(cancel, complete)
    assert not errors, f"racing calls failed: {errors!r}"
    return done[0]


def test_cancelling_a_batch_while_its_members_complete_never_deadlocks(conn: Conn, connect: ConnectFactory) -> None:
    """cancel_batch flags the running members in id order while the worker completes them in its own order:
    no deadlock; every member ends, succeeded or cancelled, exactly once. (A guard: on the old complete_many
    the two statements' timings seldom crossed here; the test above is the one that reproduced it.)"""
    canceller, completer = connect(), connect()
    rounds, per_round = 24, 300
    for r in range(rounds):
        rows = conn.execute(
            "SELECT id, batch_id FROM pgjobs.enqueue_many(%s, as_batch => true)", [Jsonb([{"kind": "k"}] * per_round)]
        ).fetchall()
        batch = int(rows[0][1])
        held = sorted(claim(conn, per_round))
        assert {p[0] for p in held} == {int(r[0]) for r in rows}
        assert _cancel_complete_round(canceller, completer, batch, held, (r % 12 - 6) * 0.0005) == per_round
        states = dict(
            conn.execute("SELECT state::text, count(*) FROM pgjobs.jobs WHERE batch_id = %s GROUP BY 1", [batch])
        )
        assert sum(states.values()) == per_round and set(states) <= {"succeeded", "cancelled"}, states


def test_a_completion_that_keeps_losing_races_is_retried_not_raised(dsn: str, conn: Conn) -> None:
    """complete_many losing more races in a row than TRANSIENT_TRIES (a deadlock storm): the completer keeps
    running the batch again, as it does through an outage, instead of raising out of the worker (which ended the
    worker and left jobs that had run to run a second time)."""
    from pgjobs.runtime.state import TRANSIENT_TRIES

    fails = TRANSIENT_TRIES + 3
    conn.execute(
        f"""
        CREATE SEQUENCE public.fault_complete;
        CREATE FUNCTION public.lost_race() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF OLD.state = 'active' AND NEW.state = 'succeeded' AND nextval('public.fault_complete') <= {fails} THEN
                RAISE EXCEPTION USING ERRCODE = '40P01', MESSAGE = 'injected deadlock in complete of job ' || NEW.id;
            END IF;
            RETURN NEW;
        END;
        $$;
        CREATE TRIGGER lost_race BEFORE UPDATE ON pgjobs.jobs FOR EACH ROW EXECUTE FUNCTION public.lost_race();
        """
    )
    app = pgjobs.App()

    @app.job("ok")
    async def ok(payload: Any, ctx: pgjobs.JobContext) -> str:
        return "ok"

    conn.execute("SELECT count(*) FROM pgjobs.enqueue_many(%s)", [Jsonb([{"kind": "ok", "max_attempts": 1}] * 5)])
    worker = pgjobs.Worker(app, dsn, {"default": 10}, lease=30, scheduler=False, poll_interval=0.5)

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            with anyio.fail_after(60):
                while conn.execute("SELECT count(*) FROM pgjobs.jobs WHERE state <> 'succeeded'").fetchone() != (0,):
                    await anyio.sleep(0.05)
            worker.stop()

    anyio.run(main)  # raised the 40P01 (DeadlockDetected) out of worker.run before the fix
    assert conn.execute("SELECT state::text, attempt, count(*) FROM pgjobs.jobs GROUP BY 1, 2").fetchall() == [
        ("succeeded", 1, 5)
    ]
    used = conn.execute("SELECT last_value FROM public.fault_complete").fetchone()
    assert used is not None and used[0] > fails
    assert worker.transient_retries >= fails

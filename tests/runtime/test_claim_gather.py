"""The claimer's wait for free slots after a dear full claim (pgjobs/runtime/claimer.py, _gather): it returns once
half a chunk is free, or when its time is up, whichever comes first (no database: the loop's own timing rule);
and a worker whose every full claim counts as dear runs a backlog to the end and stops (PostgreSQL)."""

from __future__ import annotations

import time
from typing import Any

import anyio
import psycopg
import pytest

import pgjobs
from pgjobs import App, AsyncClient, Worker
from pgjobs.runtime import claimer
from pgjobs.runtime.claimer import _gather
from pgjobs.runtime.state import QueueState
from tests.runtime.test_worker import completed, run_worker


def _busy(capacity: int, running: int) -> QueueState:
    q = QueueState("q", capacity, 1)
    q.running = running
    return q


async def _free_slots(q: QueueState, n: int, every: float) -> None:
    for _ in range(n):
        await anyio.sleep(every)
        q.running -= 1
        q.poke("slot")


def test_returns_once_half_a_chunk_is_free() -> None:
    async def main() -> tuple[float, int]:
        q = _busy(50, 46)  # 4 free, half a chunk is 25
        async with anyio.create_task_group() as tg:
            tg.start_soon(_free_slots, q, 46, 0.002)
            t0 = time.perf_counter()
            await _gather(q, 10.0)
            took, free = time.perf_counter() - t0, q.capacity - q.running
            tg.cancel_scope.cancel()
        return took, free

    took, free = anyio.run(main)
    assert free >= 25
    assert free < 30  # it claimed soon after: not once every slot was free
    assert took < 5.0


def test_gives_up_after_its_time_when_slots_stay_busy() -> None:
    async def main() -> float:
        q = _busy(50, 48)
        t0 = time.perf_counter()
        await _gather(q, 0.05)
        return time.perf_counter() - t0

    took = anyio.run(main)
    assert 0.04 <= took < 2.0


def test_does_not_wait_when_nothing_runs() -> None:
    async def main() -> float:
        q = _busy(50, 0)
        q.reserved = 40  # claims in flight: nothing running would free a slot
        t0 = time.perf_counter()
        await _gather(q, 5.0)
        return time.perf_counter() - t0

    assert anyio.run(main) < 1.0


def test_a_worker_that_waits_after_every_full_claim_runs_a_backlog_to_the_end(
    dsn: str, conn: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(claimer, "GATHER_PER_JOB", 0.0)  # every full claim counts as dear: the wait always runs
    app = App()

    @app.job("short")
    async def short(payload: Any, ctx: pgjobs.JobContext) -> None:
        await anyio.sleep(0.002)

    conn.execute("SELECT count(*) FROM pgjobs.enqueue_many(%s)", [psycopg.types.json.Jsonb([{"kind": "short"}] * 600)])

    async def body(worker: Worker, client: AsyncClient) -> None:
        await completed(worker, 600, timeout=45)

    worker = run_worker(app, dsn, body, queues={"default": 20})
    assert worker.completed == 600
    states = dict(conn.execute("SELECT state::text, count(*) FROM pgjobs.jobs GROUP BY 1").fetchall())
    assert states == {"succeeded": 600}


def test_a_claim_that_outlasts_its_deadline_is_an_outage_not_a_crash(
    dsn: str, conn: psycopg.Connection[Any], connect: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim that does not answer within its deadline (the lease, at least CLAIM_DEADLINE_MIN) is cancelled,
    and psycopg closes its connection. The claimer went on to read the rows of the claim it had just given up
    and died of "no result available" (the fair soak under a held snapshot, a claim stuck for over 30 s): the
    worker stopped working. It now counts it as an outage: a new connection, a back-off, and the work goes on.
    Here a session holds the queues table locked for a while, so that the claim waits past its deadline."""
    monkeypatch.setattr(claimer, "CLAIM_DEADLINE_MIN", 0.3)
    app = App()

    @app.job("short")
    async def short(payload: Any, ctx: pgjobs.JobContext) -> None:
        pass

    blocker = connect(autocommit=False)

    async def body(worker: Worker, client: AsyncClient) -> None:
        blocker.execute("LOCK TABLE pgjobs.queues IN ACCESS EXCLUSIVE MODE")
        # (a blocking call: a claim that ended as the lock was granted has its answer read by the event loop
        # only now; counted before the wait, not as one answered during it)
        await anyio.sleep(0.1)
        calls = worker.claim_calls
        await anyio.sleep(1.4)  # the poll's claims wait for the lock past their 0.5 s deadline
        blocker.rollback()
        assert worker.claim_calls == calls  # (none answered meanwhile)
        await client.enqueue_many([{"kind": "short"}] * 20)
        await completed(worker, 20)

    worker = run_worker(app, dsn, body, queues={"default": 5}, lease=0.5)
    assert worker.completed == 20

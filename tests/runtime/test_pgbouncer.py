"""Workers and producers through PgBouncer in transaction pooling mode.

A private PgBouncer (Debian's 1.18: no protocol-level prepared statements in transaction mode) with 2 server
connections per database, in front of the test server: clients share server sessions all the time, so any
session state (SET, session advisory locks, LISTEN, prepared statements) would break. The worker LISTENs on
a direct DSN (``listen_dsn``); everything else goes through the pooler with ``prepare=False``.
"""

from __future__ import annotations

import io
import logging
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from functools import partial
from typing import Any

import anyio
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

import pgjobs
from pgjobs import App, AsyncClient, Client, JobState, Retry, Worker
from tests.helpers.pgbouncer import Bouncer, pgbouncer_binary, start_pgbouncer

pytestmark = pytest.mark.skipif(
    pgbouncer_binary() is None,
    reason="pgbouncer is not installed (Debian package 'pgbouncer': apt-get install -y pgbouncer)",
)


@pytest.fixture
def bouncer(dsn: str, pg_server_dsn: str) -> Iterator[Bouncer]:
    b = start_pgbouncer(pg_server_dsn, dbname=conninfo_to_dict(dsn)["dbname"])
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def pooled_dsn(bouncer: Bouncer, dsn: str) -> str:
    return bouncer.dsn(conninfo_to_dict(dsn)["dbname"])


def test_the_pooler_really_shares_sessions(pooled_dsn: str, bouncer: Bouncer) -> None:
    """The harness proves itself: psycopg's automatic prepared statements break through it, a SET leaks to
    another client, and the admin console says transaction mode."""
    conns = [psycopg.connect(pooled_dsn, autocommit=True) for _ in range(3)]
    try:
        with pytest.raises(psycopg.errors.DuplicatePreparedStatement):
            for i in range(20):  # past prepare_threshold (5), the statement is prepared on whichever server
                for c in conns:
                    c.execute("SELECT %s::int", (i,))
    finally:
        for c in conns:
            c.close()
    with psycopg.connect(bouncer.dsn("pgbouncer"), autocommit=True, prepare_threshold=None) as admin:
        admin.cursor().execute("SHOW CONFIG")
        modes = [r for r in admin.execute("SHOW CONFIG").fetchall() if r[0] == "pool_mode"]
    assert modes and modes[0][1] == "transaction"


def test_producer_lifecycle_through_pgbouncer(pooled_dsn: str, dsn: str) -> None:
    """Every client call a producer and an operator make, from 4 threads sharing 2 server connections."""
    errors: list[BaseException] = []

    def produce(n: int) -> None:
        try:
            with Client(pooled_dsn, prepare=False, max_size=2) as client:
                for i in range(15):  # past psycopg's prepare_threshold
                    client.enqueue("p", {"n": n, "i": i}, queue="bulk", unique_key=f"{n}-{i}")
                again = client.enqueue("p", {}, queue="bulk", unique_key=f"{n}-0")
                assert not again.created
                for i in range(8):  # plain specs go as columns (pgjobs.enqueue_arrays, binary lists)
                    made = client.enqueue_many([{"kind": "p", "queue": "cols", "payload": {"n": n, "i": i}}] * 2)
                    assert len(made) == 2 and all(s.created for s in made)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    with Client(pooled_dsn, prepare=False) as client:
        assert sum(s.jobs for s in client.stats() if s.queue == "bulk") == 60
        assert sum(s.jobs for s in client.stats() if s.queue == "cols") == 64
        specs = client.enqueue_many(
            [{"ref": "a", "kind": "k"}, {"ref": "b", "kind": "k", "depends_on": [{"ref": "a", "on": "success"}]}],
            as_batch=True,
        )
        a, b = specs
        claimed = client.claim("w", ["default"], 5)
        assert [c.id for c in claimed] == [a.id]
        token = claimed[0].lease_token
        assert client.checkpoint(a.id, token, {"step": 1})
        assert client.progress(a.id, token, {"done": 1, "total": 2})
        assert client.complete(a.id, token, {"ok": True})
        assert client.job_status(b.id).state == JobState.PENDING  # type: ignore[union-attr]
        (cb,) = client.claim("w", ["default"], 5)
        assert client.fail(cb.id, cb.lease_token, "boom", datetime.now(UTC)) == JobState.PENDING
        assert client.cancel(b.id)
        assert client.retry(b.id)
        assert client.job_status(b.id).state == JobState.PENDING  # type: ignore[union-attr]
        client.configure_queue("bulk", paused=True)
        assert client.list_jobs(queue="bulk", max_rows=5)
        client.worker_heartbeat("w", {"heartbeat_interval": 1})
        assert [w.id for w in client.list_workers()] == ["w"]
        assert client.deregister_worker("w")


def test_worker_lifecycle_through_pgbouncer(pooled_dsn: str, dsn: str, conn: psycopg.Connection[Any]) -> None:
    """A worker (claim, checkpoint, progress, complete, fail and retry, cancel, the scheduler) and an async
    producer, both through the pooler; LISTEN direct. With a 30 s poll, every wake-up within seconds proves
    the notifications arrive."""
    app = App()
    tries: dict[int, int] = {}
    started = threading.Event()

    @app.job("steps")
    async def steps(payload: Any, ctx: pgjobs.JobContext) -> dict[str, Any]:
        for i in range(3):
            assert await ctx.save_checkpoint({"i": i})
            assert await ctx.report_progress({"done": i + 1, "total": 3})
        return {"steps": 3}

    @app.job("flaky")
    async def flaky(payload: Any, ctx: pgjobs.JobContext) -> int:
        tries[ctx.id] = ctx.attempt
        if ctx.attempt == 1:
            raise Retry(0, "first try fails")
        return ctx.attempt

    @app.job("long")
    async def long(payload: Any, ctx: pgjobs.JobContext) -> None:
        started.set()
        await ctx.cancelled.wait()

    @app.job("tick")
    async def tick(payload: Any, ctx: pgjobs.JobContext) -> str:
        return "ticked"

    worker = Worker(
        app, pooled_dsn, {"default": 4}, listen_dsn=dsn, prepare=False, poll_interval=30.0, heartbeat_interval=0.5,
        scheduler=True, grace_period=2.0,
    )  # fmt: skip

    async def main() -> None:
        async with AsyncClient(pooled_dsn, prepare=False) as client, anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            with anyio.fail_after(15):
                while not worker.started.is_set():
                    await anyio.sleep(0.01)
            with anyio.fail_after(30):
                for _ in range(3):  # repeats cross psycopg's prepare threshold on every connection
                    s = await client.enqueue("steps", {})
                    f = await client.enqueue("flaky", {})
                    done = await _wait(client, s.id, JobState.SUCCEEDED)
                    assert done.result == {"steps": 3} and done.progress == {"done": 3, "total": 3}
                    assert done.checkpoint == {"i": 2}
                    retried = await _wait(client, f.id, JobState.SUCCEEDED)
                    assert retried.result == 2 and retried.attempt == 2
                lj = await client.enqueue("long", {})
                await anyio.to_thread.run_sync(started.wait, 10)
                assert await client.cancel(lj.id)
                await _wait(client, lj.id, JobState.CANCELLED)
                await client.upsert_schedule("every-minute", "tick", "* * * * *", datetime.now(UTC))
                while not (ticks := await client.list_jobs(kind="tick")):
                    await anyio.sleep(0.05)
                await _wait(client, ticks[0].id, JobState.SUCCEEDED)
                me = [w for w in await client.list_workers() if w.id == worker.name]
                assert me and me[0].live
            worker.stop()

    t0 = time.monotonic()
    anyio.run(main)
    assert time.monotonic() - t0 < 30  # no wake-up waited for the 30 s poll
    assert conn.execute("SELECT count(*) FROM pgjobs.workers").fetchone() == (0,)  # deregistered on stop
    assert conn.execute("SELECT count(*) FROM pgjobs.jobs WHERE state = 'active'").fetchone() == (0,)


async def _wait(client: AsyncClient, job_id: int, state: JobState) -> pgjobs.JobStatus:
    while True:
        st = await client.job_status(job_id)
        if st is not None and st.state == state:
            return st
        if st is not None and st.state.terminal:
            raise AssertionError(f"job {job_id} ended {st.state}, expected {state}: {st.last_error}")
        await anyio.sleep(0.02)


def test_an_outage_is_one_line_when_lost_and_one_when_back(bouncer: Bouncer, pooled_dsn: str, dsn: str) -> None:
    """PgBouncer stopped for ~3 s under a busy worker and its scheduler (every part polling every 0.2 s, all
    connections through the pooler): the log says so once, and once more when it is back; the work goes on."""
    from pgjobs.runtime.logs import configure_logging

    app = App()

    @app.job("ok")
    async def ok(payload: Any, ctx: pgjobs.JobContext) -> None:
        return None

    out = io.StringIO()
    handler = configure_logging("info", "text", out)
    worker = Worker(
        app, pooled_dsn, {"default": 2}, prepare=False, listen_dsn=pooled_dsn, poll_interval=0.2,
        heartbeat_interval=0.2, lease=3.0, scheduler=True, grace_period=1.0,
    )  # fmt: skip
    marks: dict[str, int] = {}

    async def main() -> None:
        async with AsyncClient(dsn) as client, anyio.create_task_group() as tg:  # the producer goes direct
            tg.start_soon(worker.run)
            with anyio.fail_after(30):
                while not worker.started.is_set():
                    await anyio.sleep(0.01)
                await _wait(client, (await client.enqueue("ok", {})).id, JobState.SUCCEEDED)
                marks["before"] = len(out.getvalue().splitlines())
                await anyio.to_thread.run_sync(bouncer.stop)
                await anyio.sleep(3.0)
                during = await client.enqueue("ok", {})
                restarted = await anyio.to_thread.run_sync(
                    partial(
                        start_pgbouncer, bouncer.server_dsn, dbname=conninfo_to_dict(dsn)["dbname"], port=bouncer.port
                    )
                )
                try:
                    await _wait(client, during.id, JobState.SUCCEEDED)
                    await anyio.sleep(1.0)  # every part has had its turn to notice
                    marks["after"] = len(out.getvalue().splitlines())
                    worker.stop()
                finally:
                    tg.start_soon(_stop_later, restarted)

    try:
        anyio.run(main)
    finally:
        logging.getLogger().removeHandler(handler)
        logging.getLogger().setLevel(logging.WARNING)
    lines = out.getvalue().splitlines()[marks["before"] : marks["after"]]
    lost = [line for line in lines if "database unreachable" in line]
    back = [line for line in lines if "reachable again" in line]
    assert len(lost) == 1 and " WARNING " in lost[0], lines
    assert len(back) == 1 and " INFO " in back[0], lines
    noisy = [line for line in lines if " WARNING " in line or " ERROR " in line]
    # the worker's lost line, and the scheduler's pass and LISTEN lines (once each), not one per retry
    assert len(noisy) <= 4, noisy


async def _stop_later(b: Bouncer) -> None:
    await anyio.sleep(2.0)  # after the worker's last call through it
    await anyio.to_thread.run_sync(b.stop)

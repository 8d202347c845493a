"""Cancellation and the worker's lifecycle, with a real worker:

* ``cancel`` of a running async handler interrupts it within a few hundred ms and ends it ``cancelled``;
  sync handlers stay cooperative (``ctx.cancelled``);
* a ``NOTIFY pgjobs_cancel, '<id>'`` sent by any role is only a hint: without a cancellation requested in
  SQL the job keeps running and succeeds;
* ``async with pgjobs.Worker(...)`` runs a worker for a block; ``stop()`` right after ``run()`` is quiet.
"""

from __future__ import annotations

import logging
import secrets
import time
import warnings
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import psycopg
import pytest
from psycopg import sql

import pgjobs
from pgjobs import App, AsyncClient, JobState, Worker

Body = Callable[[Worker, AsyncClient], Awaitable[None]]


def run_worker(app: App, dsn: str, body: Body, **kwargs: Any) -> Worker:
    kwargs.setdefault("scheduler", False)
    kwargs.setdefault("poll_interval", 0.5)
    worker = Worker(app, dsn, **kwargs)

    async def main() -> None:
        async with AsyncClient(dsn) as client, anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            with anyio.fail_after(15):
                while not worker.started.is_set():
                    await anyio.sleep(0.01)
            try:
                with anyio.fail_after(60):
                    await body(worker, client)
            finally:
                worker.stop()

    anyio.run(main)
    return worker


async def wait_state(client: AsyncClient, job_id: int, *states: JobState, timeout: float = 20) -> pgjobs.JobStatus:
    with anyio.fail_after(timeout):
        while True:
            st = await client.job_status(job_id)
            if st is not None and st.state in states:
                return st
            await anyio.sleep(0.01)


@pytest.mark.smoke
def test_cancel_interrupts_an_async_handler_within_a_second(dsn: str) -> None:
    app = App()
    started = anyio.Event()
    interrupted: list[bool] = []

    @app.job("sleeper")
    async def sleeper(payload: Any, ctx: pgjobs.JobContext) -> str:
        started.set()
        try:
            await anyio.sleep(20)  # before the fix: ran to the end after `pgjobs cancel`
        except anyio.get_cancelled_exc_class():
            interrupted.append(True)
            raise
        return "slept"

    async def body(worker: Worker, client: AsyncClient) -> None:
        job = await client.enqueue("sleeper")
        with anyio.fail_after(10):
            await started.wait()
        t0 = time.monotonic()
        assert await client.cancel(job.id)
        st = await wait_state(client, job.id, JobState.CANCELLED, JobState.SUCCEEDED, timeout=5)
        elapsed = time.monotonic() - t0
        assert st.state == JobState.CANCELLED and st.result is None
        assert elapsed < 1.0, f"cancelled after {elapsed:.2f} s"

    worker = run_worker(app, dsn, body)
    assert interrupted == [True] and worker.cancelled == 1


def test_sync_handlers_stay_cooperative(dsn: str) -> None:
    app = App()
    seen: list[str | None] = []

    @app.job("polite")
    def polite(payload: Any, ctx: pgjobs.SyncJobContext) -> str:
        assert ctx.cancelled.wait_blocking(20)
        seen.append(ctx.cancelled.reason)
        return "stopped when asked"

    async def body(worker: Worker, client: AsyncClient) -> None:
        job = await client.enqueue("polite")
        await wait_state(client, job.id, JobState.ACTIVE)
        await anyio.sleep(0.2)
        assert await client.cancel(job.id)
        st = await wait_state(client, job.id, JobState.CANCELLED, JobState.SUCCEEDED, timeout=5)
        assert st.state == JobState.CANCELLED

    run_worker(app, dsn, body)
    assert seen == ["cancel requested"]


def test_a_forged_cancel_notification_cancels_nothing(dsn: str, pg_server_dsn: str) -> None:
    # any role may NOTIFY any channel: a role with no pgjobs rights at all sends the forged hint
    role = f"forger_{secrets.token_hex(4)}"
    with psycopg.connect(pg_server_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    try:
        _forged_cancel(dsn, role)
    finally:
        with psycopg.connect(pg_server_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


def _forged_cancel(dsn: str, role: str) -> None:
    app = App()
    started = anyio.Event()
    flags: list[bool] = []

    @app.job("work")
    async def work(payload: Any, ctx: pgjobs.JobContext) -> str:
        started.set()
        await anyio.sleep(1.5)
        flags.append(ctx.cancelled.is_set())
        return "done"

    forger_dsn = psycopg.conninfo.make_conninfo(dsn, user=role)

    async def body(worker: Worker, client: AsyncClient) -> None:
        job = await client.enqueue("work")
        with anyio.fail_after(10):
            await started.wait()
        with psycopg.connect(forger_dsn, autocommit=True) as forger:
            forger.execute(sql.SQL("NOTIFY pgjobs_cancel, {}").format(sql.Literal(str(job.id))))
        st = await wait_state(client, job.id, JobState.SUCCEEDED, JobState.CANCELLED, timeout=10)
        assert st.state == JobState.SUCCEEDED and st.result == "done"  # before the fix: cancelled

    worker = run_worker(app, dsn, body)
    assert flags == [False] and worker.cancelled == 0


def test_async_with_runs_the_worker_for_the_block(dsn: str) -> None:
    app = App()

    @app.job("k", queue="q1")
    async def k(payload: Any, ctx: pgjobs.JobContext) -> int:
        return int(payload["n"]) * 2

    async def main() -> pgjobs.JobStatus | None:
        async with AsyncClient(dsn, app=app) as client:
            job = await client.enqueue("k", {"n": 21})
            async with Worker(app, dsn, queues=app.queues, poll_interval=0.5, scheduler=False) as worker:
                await anyio.to_thread.run_sync(worker.started.wait, 15)
                st = await wait_state(client, job.id, JobState.SUCCEEDED)
                assert worker.started.is_set()
            assert worker.active == 0  # stopped when the block ended
            return st

    st = anyio.run(main)
    assert st is not None and st.result == 42


def test_stop_right_after_run_logs_no_psycopg_warnings(dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    app = App()

    @app.job("k")
    async def k(payload: Any, ctx: pgjobs.JobContext) -> None: ...

    async def main() -> None:
        worker = Worker(app, dsn, poll_interval=0.5)
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            await anyio.sleep(0)
            worker.stop()

    with caplog.at_level(logging.WARNING), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            anyio.run(main)
    noisy = [r for r in caplog.records if r.name.startswith("psycopg")]
    assert noisy == [], [r.getMessage() for r in noisy]  # before: "query cancellation interrupted ..."
    assert [w for w in caught if "psycopg" in str(w.filename)] == []

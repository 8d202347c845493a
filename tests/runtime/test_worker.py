"""The worker runtime in-process: handlers (async and sync), outcomes (complete, fail, Retry, Snooze, timeout,
cancel, lease lost), capacity and kind limits, wake-ups (LISTEN and next_due_at), checkpoints/progress,
heartbeat/reap, graceful stop. Real PostgreSQL; each test runs a Worker in its own event loop."""

from __future__ import annotations

import threading
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import psycopg
import pytest

import pgjobs
from pgjobs import App, AsyncClient, JobState, Retry, Snooze, Worker

Body = Callable[[Worker, AsyncClient], Awaitable[None]]


def run_worker(app: App, dsn: str, body: Body, **kwargs: Any) -> Worker:
    """Runs ``body(worker, client)`` while a Worker runs, then stops the worker gracefully."""
    kwargs.setdefault("scheduler", False)
    kwargs.setdefault("poll_interval", 0.5)
    kwargs.setdefault("heartbeat_interval", 1.0)
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


async def claimed_again(worker: Worker, times: int = 1, timeout: float = 30) -> None:
    """Until the worker made ``times`` more claim calls (each an empty one for an idle worker)."""
    target = worker.claim_calls + times
    with anyio.fail_after(timeout):
        while worker.claim_calls < target:
            await anyio.sleep(0.01)


async def completed(worker: Worker, n: int, timeout: float = 30) -> None:
    """Until the worker has completed ``n`` jobs."""
    with anyio.fail_after(timeout):
        while worker.completed < n:
            await anyio.sleep(0.02)


async def wait_state(client: AsyncClient, job_id: int, *states: JobState, timeout: float = 20) -> pgjobs.JobStatus:
    with anyio.fail_after(timeout):
        while True:
            st = await client.job_status(job_id)
            if st is not None and st.state in states:
                return st
            await anyio.sleep(0.02)


@pytest.mark.smoke
def test_async_and_sync_handlers_complete_with_results(dsn: str) -> None:
    app = App()
    threads: dict[str, str] = {}

    @app.job("add")
    async def add(payload: dict[str, int], ctx: pgjobs.JobContext) -> int:
        threads["add"] = threading.current_thread().name
        return payload["a"] + payload["b"]

    @app.job("mul")
    def mul(payload: dict[str, int], ctx: pgjobs.SyncJobContext) -> dict[str, int]:
        threads["mul"] = threading.current_thread().name
        return {"product": payload["a"] * payload["b"]}

    @app.job("nothing")
    async def nothing(payload: Any, ctx: pgjobs.JobContext) -> None:
        return None

    async def body(worker: Worker, client: AsyncClient) -> None:
        a = await client.enqueue("add", {"a": 2, "b": 3})
        m = await client.enqueue("mul", {"a": 4, "b": 5})
        n = await client.enqueue("nothing", {})
        sa = await wait_state(client, a.id, JobState.SUCCEEDED)
        sm = await wait_state(client, m.id, JobState.SUCCEEDED)
        sn = await wait_state(client, n.id, JobState.SUCCEEDED)
        assert sa.result == 5 and sa.attempt == 1 and sa.lease_token is None
        assert sm.result == {"product": 20}
        assert sn.result is None

    run_worker(app, dsn, body)
    assert threads["add"] == threading.main_thread().name  # async handlers on the loop
    assert threads["mul"] != threading.main_thread().name  # sync handlers in worker threads
    assert app.handlers["add"].is_async and not app.handlers["mul"].is_async


def test_claims_only_kinds_it_has_handlers_for(dsn: str, conn: psycopg.Connection[Any]) -> None:
    app = App()

    @app.job("known")
    async def known(payload: Any, ctx: pgjobs.JobContext) -> None:
        return None

    async def body(worker: Worker, client: AsyncClient) -> None:
        stranger = await client.enqueue("unknown-kind", {})
        k = await client.enqueue("known", {})
        await wait_state(client, k.id, JobState.SUCCEEDED)
        await claimed_again(worker)  # (the poll at 0.5 s, at the latest) and left the stranger alone
        st = await client.job_status(stranger.id)
        assert st is not None and st.state == JobState.PENDING and st.attempt == 0

    run_worker(app, dsn, body)


def test_never_more_than_free_capacity_per_queue(dsn: str, connect: Any) -> None:
    app = App()
    running = {"default": 0, "emails": 0}
    peak = {"default": 0, "emails": 0}

    @app.job("slow")
    async def slow(payload: Any, ctx: pgjobs.JobContext) -> None:
        running[ctx.queue] += 1
        peak[ctx.queue] = max(peak[ctx.queue], running[ctx.queue])
        await anyio.sleep(0.05)
        running[ctx.queue] -= 1

    db_peak = {"active": 0}
    watcher = connect()
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            row = watcher.execute("SELECT count(*) FROM pgjobs.jobs WHERE state = 'active'").fetchone()
            db_peak["active"] = max(db_peak["active"], int(row[0]) if row else 0)
            time.sleep(0.005)

    async def body(worker: Worker, client: AsyncClient) -> None:
        ids = []
        for i in range(24):
            ids.append((await client.enqueue("slow", {"i": i}, queue="default")).id)
            ids.append((await client.enqueue("slow", {"i": i}, queue="emails")).id)
        for i in ids:
            await wait_state(client, i, JobState.SUCCEEDED)

    t = threading.Thread(target=watch)
    t.start()
    try:
        worker = run_worker(app, dsn, body, queues={"default": 3, "emails": 2})
    finally:
        stop.set()
        t.join()
    assert peak == {"default": 3, "emails": 2}
    # a slot frees when its handler returns, and the completion may trail by one complete_many
    assert db_peak["active"] <= 2 * (3 + 2)
    assert worker.completed == 48


def test_exception_fails_with_traceback_and_sql_backoff(dsn: str) -> None:
    app = App()

    @app.job("boom")
    async def boom(payload: Any, ctx: pgjobs.JobContext) -> None:
        raise ZeroDivisionError("divided by nothing")

    async def body(worker: Worker, client: AsyncClient) -> None:
        j = await client.enqueue("boom", {}, max_attempts=3)
        st = await wait_state(client, j.id, JobState.SCHEDULED)
        assert st.attempt == 1
        assert st.last_error is not None
        assert "ZeroDivisionError: divided by nothing" in st.last_error
        assert "Traceback (most recent call last)" in st.last_error
        assert st.errors[-1]["attempt"] == 1 and st.errors[-1]["worker"] == worker.name
        assert st.run_at > datetime.now(UTC)  # the SQL backoff (about a second for attempt 1)

    run_worker(app, dsn, body)


def test_retry_and_snooze(dsn: str) -> None:
    app = App()
    seen: list[tuple[str, int]] = []

    @app.job("retry")
    async def retry(payload: Any, ctx: pgjobs.JobContext) -> str:
        seen.append(("retry", ctx.attempt))
        if ctx.attempt == 1:
            raise Retry(after=0.2)
        return "second time lucky"

    @app.job("retry-late")
    async def retry_late(payload: Any, ctx: pgjobs.JobContext) -> None:
        raise Retry(after=timedelta(hours=1))

    @app.job("retry-last")
    async def retry_last(payload: Any, ctx: pgjobs.JobContext) -> None:
        raise Retry(after=0)

    @app.job("snooze")
    def snooze(payload: Any, ctx: pgjobs.SyncJobContext) -> None:
        raise Snooze(until=timedelta(hours=2))

    async def body(worker: Worker, client: AsyncClient) -> None:
        r = await client.enqueue("retry", {})
        late = await client.enqueue("retry-late", {})
        last = await client.enqueue("retry-last", {}, max_attempts=1)
        s = await client.enqueue("snooze", {})
        st = await wait_state(client, r.id, JobState.SUCCEEDED)
        assert st.attempt == 2 and st.result == "second time lucky"
        assert "retry requested" in (st.errors[0]["error"])
        st = await wait_state(client, late.id, JobState.SCHEDULED)
        assert st.attempt == 1 and st.run_at > datetime.now(UTC) + timedelta(minutes=50)
        st = await wait_state(client, last.id, JobState.FAILED)  # Retry spends the (last) attempt
        assert st.attempt == 1
        st = await wait_state(client, s.id, JobState.SCHEDULED)
        assert st.attempt == 0  # a snooze gives the attempt back
        assert st.run_at > datetime.now(UTC) + timedelta(minutes=110)

    run_worker(app, dsn, body, poll_interval=0.2)
    assert seen == [("retry", 1), ("retry", 2)]


def test_handler_retry_policy(dsn: str) -> None:
    app = App()

    @app.job("flaky", retry=[3600.0])
    async def flaky(payload: Any, ctx: pgjobs.JobContext) -> None:
        raise RuntimeError("nope")

    async def body(worker: Worker, client: AsyncClient) -> None:
        j = await client.enqueue("flaky", {})
        st = await wait_state(client, j.id, JobState.SCHEDULED)
        assert st.run_at > datetime.now(UTC) + timedelta(minutes=55)

    run_worker(app, dsn, body)


def test_timeout_fails_the_job_clearly(dsn: str) -> None:
    app = App()
    cancelled = []

    @app.job("sleepy", timeout=0.3)
    async def sleepy(payload: Any, ctx: pgjobs.JobContext) -> None:
        try:
            await anyio.sleep(30)
        except BaseException:
            cancelled.append(ctx.cancelled.reason)
            raise

    @app.job("sleepy-sync", timeout=0.3)
    def sleepy_sync(payload: Any, ctx: pgjobs.SyncJobContext) -> None:
        ctx.cancelled.wait_blocking(30)  # cooperative: the flag is set when the timeout fires

    async def body(worker: Worker, client: AsyncClient) -> None:
        a = await client.enqueue("sleepy", {}, max_attempts=1)
        s = await client.enqueue("sleepy-sync", {}, max_attempts=1)
        for j in (a, s):
            st = await wait_state(client, j.id, JobState.FAILED)
            assert st.last_error is not None and st.last_error.startswith("TimeoutError")
            assert "0.3 s" in st.last_error

    run_worker(app, dsn, body)
    assert cancelled == ["timeout"]


def test_non_json_result_fails(dsn: str) -> None:
    app = App()

    @app.job("weird")
    async def weird(payload: Any, ctx: pgjobs.JobContext) -> object:
        return object()

    async def body(worker: Worker, client: AsyncClient) -> None:
        j = await client.enqueue("weird", {}, max_attempts=1)
        st = await wait_state(client, j.id, JobState.FAILED)
        assert st.last_error is not None and "not JSON" in st.last_error

    run_worker(app, dsn, body)


@pytest.mark.smoke
def test_cancel_running_jobs_cooperatively(dsn: str) -> None:
    app = App()
    started: set[int] = set()

    @app.job("waits")
    async def waits(payload: Any, ctx: pgjobs.JobContext) -> str:
        started.add(ctx.id)
        await ctx.cancelled.wait()
        return "saw the cancel"  # returning after a cancel request still ends the job cancelled

    @app.job("polls")
    def polls(payload: Any, ctx: pgjobs.SyncJobContext) -> None:
        started.add(ctx.id)
        while True:
            ctx.raise_if_cancelled()
            time.sleep(0.01)

    async def body(worker: Worker, client: AsyncClient) -> None:
        a = await client.enqueue("waits", {})
        s = await client.enqueue("polls", {})
        await wait_state(client, a.id, JobState.ACTIVE)
        await wait_state(client, s.id, JobState.ACTIVE)
        with anyio.fail_after(10):
            while started != {a.id, s.id}:
                await anyio.sleep(0.01)
        assert await client.cancel(a.id)
        assert await client.cancel(s.id)
        for j in (a, s):
            st = await wait_state(client, j.id, JobState.CANCELLED)
            assert st.result is None and st.lease_token is None

    worker = run_worker(app, dsn, body)
    assert worker.cancelled == 2


def test_lost_lease_cancels_the_local_task(dsn: str, conn: psycopg.Connection[Any]) -> None:
    app = App()
    outcome: list[str | None] = []

    @app.job("long")
    async def long(payload: Any, ctx: pgjobs.JobContext) -> None:
        try:
            await anyio.sleep(30)
        except BaseException:
            outcome.append(ctx.cancelled.reason)
            raise

    async def body(worker: Worker, client: AsyncClient) -> None:
        j = await client.enqueue("long", {})
        await wait_state(client, j.id, JobState.ACTIVE)
        # Another claimer took the job over (its lease expired elsewhere): the token changed.
        conn.execute(
            "UPDATE pgjobs.jobs SET lease_token = gen_random_uuid(), leased_by = 'thief' WHERE id = %s", [j.id]
        )
        with anyio.fail_after(10):
            while not outcome:
                await anyio.sleep(0.02)
        st = await client.job_status(j.id)
        assert st is not None and st.state == JobState.ACTIVE and st.leased_by == "thief"  # untouched by us

    # a lease our own renewals (every lease/3) keep even on a loaded machine; the thief is seen at the next one
    worker = run_worker(app, dsn, body, lease=3.0)
    assert outcome == ["lease lost"]
    assert worker.lost == 1


def test_lease_renewal_keeps_long_jobs(dsn: str) -> None:
    app = App()

    @app.job("long")
    async def long(payload: Any, ctx: pgjobs.JobContext) -> str:
        await anyio.sleep(4.5)  # more than twice the lease
        return "done"

    async def body(worker: Worker, client: AsyncClient) -> None:
        j = await client.enqueue("long", {})
        st = await wait_state(client, j.id, JobState.SUCCEEDED)
        assert st.attempt == 1 and st.result == "done"

    # renewed every lease/3: a lease of 2 s survives a renewal delayed by more than a second (a loaded machine)
    run_worker(app, dsn, body, lease=2.0)


def test_checkpoint_progress_and_context(dsn: str) -> None:
    app = App()
    contexts: list[tuple[int, Any]] = []

    @app.job("steps", max_attempts=3)
    async def steps(payload: Any, ctx: pgjobs.JobContext) -> dict[str, Any]:
        contexts.append((ctx.attempt, ctx.checkpoint))
        assert ctx.kind == "steps" and ctx.queue == "default" and ctx.max_attempts == 3 and ctx.lease_token
        start = (ctx.checkpoint or {}).get("done", 0)
        for step in range(start, 4):
            assert await ctx.report_progress({"step": step, "of": 4})
            assert await ctx.save_checkpoint({"done": step + 1})
            if step == 1 and ctx.attempt == 1:
                raise RuntimeError("interrupted")
        return {"from": start}

    @app.job("steps-sync")
    def steps_sync(payload: Any, ctx: pgjobs.SyncJobContext) -> str:
        assert ctx.report_progress({"half": True})
        assert ctx.save_checkpoint({"sync": 1})
        return "ok"

    async def body(worker: Worker, client: AsyncClient) -> None:
        j = await client.enqueue("steps", {}, max_attempts=3)
        s = await client.enqueue("steps-sync", {})
        st = await wait_state(client, j.id, JobState.SUCCEEDED, timeout=30)
        assert st.result == {"from": 2}
        assert st.progress == {"step": 3, "of": 4} and st.checkpoint == {"done": 4}
        st = await wait_state(client, s.id, JobState.SUCCEEDED)
        assert st.progress == {"half": True} and st.checkpoint == {"sync": 1}

    run_worker(app, dsn, body, poll_interval=0.3)
    assert contexts == [(1, None), (2, {"done": 2})]


def test_wakes_on_notify_and_on_next_due_run_at(dsn: str) -> None:
    """With a poll interval far longer than the test, only the LISTEN wake-up and the next-due timer can
    start these jobs."""
    app = App()
    started: dict[int, list[float]] = {}

    @app.job("ping")
    async def ping(payload: Any, ctx: pgjobs.JobContext) -> None:
        started.setdefault(ctx.id, []).append(time.monotonic())
        if payload.get("retry") and ctx.attempt == 1:
            raise Retry(after=1.0)  # back as 'scheduled' in 1 s: no NOTIFY will say when it is due

    async def body(worker: Worker, client: AsyncClient) -> None:
        with anyio.fail_after(30):  # the worker is idle, asleep on its LISTEN connection after its first claim
            while worker.claim_calls < 1:
                await anyio.sleep(0.01)
        now = await client.enqueue("ping", {})
        await wait_state(client, now.id, JobState.SUCCEEDED, timeout=10)
        later = await client.enqueue("ping", {"retry": True})
        st = await wait_state(client, later.id, JobState.SUCCEEDED, timeout=10)
        assert st.attempt == 2
        first, second = started[later.id]
        assert second - first >= 0.9  # not before it was due

    run_worker(app, dsn, body, poll_interval=60)


def test_missed_cancel_notification_is_caught_at_lease_renewal(dsn: str, conn: psycopg.Connection[Any]) -> None:
    app = App()

    @app.job("waits")
    async def waits(payload: Any, ctx: pgjobs.JobContext) -> None:
        await ctx.cancelled.wait()

    async def body(worker: Worker, client: AsyncClient) -> None:
        j = await client.enqueue("waits", {})
        await wait_state(client, j.id, JobState.ACTIVE)
        # cancel_requested set without the pgjobs_cancel notification (as if the worker missed it)
        conn.execute("UPDATE pgjobs.jobs SET cancel_requested = true WHERE id = %s", [j.id])
        await wait_state(client, j.id, JobState.CANCELLED, timeout=10)

    run_worker(app, dsn, body, lease=3.0)  # renewed every second: the cancel is seen within one


def test_completions_are_batched(dsn: str, conn: psycopg.Connection[Any]) -> None:
    app = App()

    @app.job("noop")
    async def noop(payload: Any, ctx: pgjobs.JobContext) -> None:
        return None

    conn.execute("SELECT count(*) FROM pgjobs.enqueue_many(%s)", [psycopg.types.json.Jsonb([{"kind": "noop"}] * 400)])

    async def body(worker: Worker, client: AsyncClient) -> None:
        await completed(worker, 400)

    worker = run_worker(app, dsn, body, queues={"default": 50})
    assert worker.completed == 400
    assert worker.complete_calls < 400 / 4  # many jobs per complete_many
    row = conn.execute("SELECT count(*) FROM pgjobs.jobs WHERE state = 'succeeded'").fetchone()
    assert row is not None and row[0] == 400


def test_heartbeat_meta_and_reaping_a_silent_worker(dsn: str, conn: psycopg.Connection[Any]) -> None:
    app = App()

    @app.job("orphan")
    async def orphan(payload: Any, ctx: pgjobs.JobContext) -> str:
        return "adopted"

    # A worker that died an hour ago with a job leased for another hour.
    conn.execute("SELECT pgjobs.worker_heartbeat('ghost', '{}')")
    conn.execute("UPDATE pgjobs.workers SET last_seen = now() - interval '1 hour' WHERE id = 'ghost'")
    j = conn.execute("SELECT id FROM pgjobs.enqueue('orphan')").fetchone()
    assert j is not None
    conn.execute("SELECT * FROM pgjobs.claim('ghost', '{default}', 1, '1 hour')")

    async def body(worker: Worker, client: AsyncClient) -> None:
        workers = await client.list_workers()
        me = next(w for w in workers if w.id == worker.name)
        assert me.meta["pid"] > 0 and me.meta["host"]
        assert me.meta["queues"] == {"default": 4} and me.meta["concurrency"] == 4
        assert "active" in me.meta
        st = await wait_state(client, j[0], JobState.SUCCEEDED, timeout=15)
        assert st.attempt == 2 and st.result == "adopted"
        assert "ghost" not in {w.id for w in await client.list_workers()}

    run_worker(app, dsn, body, queues={"default": 4}, heartbeat_interval=0.3, reap_after=60)


def test_graceful_stop_finishes_then_releases(dsn: str) -> None:
    app = App()

    @app.job("quick")
    async def quick(payload: Any, ctx: pgjobs.JobContext) -> str:
        await anyio.sleep(0.2)
        return "finished within grace"

    @app.job("forever")
    async def forever(payload: Any, ctx: pgjobs.JobContext) -> None:
        await anyio.sleep(3600)

    ids: dict[str, int] = {}

    async def body(worker: Worker, client: AsyncClient) -> None:
        ids["quick"] = (await client.enqueue("quick", {})).id
        ids["forever"] = (await client.enqueue("forever", {})).id
        await wait_state(client, ids["quick"], JobState.ACTIVE)
        await wait_state(client, ids["forever"], JobState.ACTIVE)

    run_worker(app, dsn, body, grace_period=3.0)  # "quick" needs 0.2 s of it, even on a loaded machine
    with psycopg.connect(dsn, autocommit=True) as c:
        rows = dict(c.execute("SELECT id, state::text FROM pgjobs.jobs").fetchall())
        assert rows[ids["quick"]] == "succeeded"
        assert rows[ids["forever"]] == "pending"
        row = c.execute("SELECT attempt, lease_token FROM pgjobs.jobs WHERE id = %s", [ids["forever"]]).fetchone()
        assert row == (0, None)  # released: the attempt was refunded


def test_app_registry() -> None:
    app = App()

    @app.job("k", queue="q", timeout=5, max_attempts=3, retry=lambda attempt: 10 * attempt)
    def k(payload: Any, ctx: pgjobs.SyncJobContext) -> None:
        return None

    h = app.handlers["k"]
    assert (h.queue, h.timeout, h.max_attempts, h.is_async) == ("q", 5.0, 3, False)
    assert h.enqueue_defaults() == {"queue": "q", "max_attempts": 3}
    now = datetime(2030, 1, 1, tzinfo=UTC)
    assert h.retry_at(2, now) == now + timedelta(seconds=20)
    with pytest.raises(ValueError, match="already has a handler"):
        app.job("k")(k)
    with pytest.raises(ValueError):
        app.job("")
    with pytest.raises(ValueError):
        Worker(app, "postgresql://x", {"default": 0})

    @app.periodic(cron="*/5 * * * *", name="tick", timezone="Europe/Paris", payload={"x": 1})
    async def tick(payload: Any, ctx: pgjobs.JobContext) -> None:
        return None

    assert app.handlers["tick"].func is tick and app.handlers["tick"].is_async
    spec = app.periodic_specs[-1]
    assert (spec.name, spec.kind, spec.cron, spec.timezone, spec.payload) == (
        "tick",
        "tick",
        "*/5 * * * *",
        "Europe/Paris",
        {"x": 1},
    )


def test_worker_runs_the_scheduler_for_periodic_jobs(dsn: str) -> None:
    app = App()
    runs: list[int] = []

    @app.periodic(cron="* * * * * *", name="every-second")
    async def every(payload: Any, ctx: pgjobs.JobContext) -> None:
        runs.append(ctx.id)

    async def body(worker: Worker, client: AsyncClient) -> None:
        with anyio.fail_after(20):
            while not runs:
                await anyio.sleep(0.05)

    run_worker(app, dsn, body, scheduler=True)
    assert runs


def test_run_raises_on_a_database_without_the_schema(blank_dsn: str) -> None:
    worker = Worker(App(), blank_dsn, scheduler=False)
    with pytest.raises(pgjobs.SchemaMissing, match="pgjobs migrate"):
        anyio.run(worker.run)


def test_run_raises_on_an_unreachable_database() -> None:
    worker = Worker(App(), "postgresql://nobody@127.0.0.1:1/none?connect_timeout=2", scheduler=False)
    with pytest.raises(psycopg.OperationalError):
        anyio.run(worker.run)


def test_batched_completions_keep_each_result(dsn: str, conn: psycopg.Connection[Any]) -> None:
    app = App()

    @app.job("maybe")
    async def maybe(payload: dict[str, Any], ctx: pgjobs.JobContext) -> Any:
        i = payload["i"]
        return None if i % 3 == 0 else {"i": i, "text": 'quote " backslash \\ comma , brace }'} if i % 3 == 1 else i

    conn.execute(
        "SELECT count(*) FROM pgjobs.enqueue_many(%s)",
        [psycopg.types.json.Jsonb([{"kind": "maybe", "payload": {"i": i}} for i in range(120)])],
    )

    async def body(worker: Worker, client: AsyncClient) -> None:
        await completed(worker, 120)

    worker = run_worker(app, dsn, body, queues={"default": 40})
    assert worker.complete_calls < 120
    rows = conn.execute("SELECT payload, result, result IS NULL FROM pgjobs.jobs WHERE state = 'succeeded'").fetchall()
    assert len(rows) == 120
    for payload, result, is_null in rows:
        i = payload["i"]
        if i % 3 == 0:
            assert is_null  # None is SQL NULL, not JSON null
        elif i % 3 == 1:
            assert result == {"i": i, "text": 'quote " backslash \\ comma , brace }'}
        else:
            assert result == i


def test_add_to_batch_from_a_handler(dsn: str, conn: psycopg.Connection[Any]) -> None:
    app = App()
    children: list[int] = []

    @app.job("spawner")
    async def spawner(payload: Any, ctx: pgjobs.JobContext) -> int:
        assert ctx.batch_id is not None
        child = await ctx.add_to_batch({"kind": "child", "payload": {"from": ctx.id}})
        children.append(child)
        return child

    @app.job("child")
    def child(payload: dict[str, int], ctx: pgjobs.SyncJobContext) -> dict[str, int]:
        return {"parent": payload["from"]}

    row = conn.execute(
        'SELECT id, batch_id FROM pgjobs.enqueue_many(\'[{"kind": "spawner"}]\', as_batch => true)'
    ).fetchone()
    assert row is not None
    spawner_id, batch = row

    async def body(worker: Worker, client: AsyncClient) -> None:
        await wait_state(client, spawner_id, JobState.SUCCEEDED)
        with anyio.fail_after(10):
            while not children:
                await anyio.sleep(0.02)
        st = await wait_state(client, children[0], JobState.SUCCEEDED)
        assert st.batch_id == batch and st.result == {"parent": spawner_id}

    run_worker(app, dsn, body)
    state = conn.execute("SELECT state::text, total FROM pgjobs.batches WHERE id = %s", [batch]).fetchone()
    assert state == ("succeeded", 2)


def test_parent_results_filled_for_kinds_that_ask(dsn: str) -> None:
    app = App()
    seen: dict[str, Any] = {}

    @app.job("part")
    async def part(payload: dict[str, int], ctx: pgjobs.JobContext) -> dict[str, int]:
        seen.setdefault("part", ctx.parent_results)
        return {"n": payload["n"]}

    @app.job("total", parent_results=True)
    async def total(payload: Any, ctx: pgjobs.JobContext) -> int:
        seen["total"] = ctx.parent_results
        return sum(r["n"] for r in (ctx.parent_results or {}).values())

    @app.job("lonely", parent_results=True)
    def lonely(payload: Any, ctx: pgjobs.SyncJobContext) -> None:
        seen["lonely"] = ctx.parent_results

    async def body(worker: Worker, client: AsyncClient) -> None:
        async with client.graph() as g:
            parts = [g.enqueue("part", {"n": n}) for n in (1, 2, 3)]
            tot = g.enqueue("total", {}, after=parts)
        lone = await client.enqueue("lonely", {})
        assert tot.id is not None
        st = await wait_state(client, tot.id, JobState.SUCCEEDED)
        assert st.result == 6
        await wait_state(client, lone.id, JobState.SUCCEEDED)
        assert seen["total"] == {p.id: {"n": n} for p, n in zip(parts, (1, 2, 3), strict=True)}

    run_worker(app, dsn, body)
    assert seen["part"] is None  # not asked for: no extra round trip
    assert seen["lonely"] == {}

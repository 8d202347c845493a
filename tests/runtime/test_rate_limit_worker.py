"""A worker under a rate limit runs at the limit's speed, not at its poll interval's, counted in claims.

The worker's poll interval is 60 s and a key is limited to 10 starts a second: a claim holds back the jobs it
has no token for (scheduled at the key's next token times), and the poller sleeps until the next of them is
due. Twenty jobs finishing inside the outer timeout (40 s: ten start at once, and waiting for the poll would
start the next ten a minute later), with about one claim per job and no more, show that no claim waited for the
poll and none spun.
"""

from __future__ import annotations

from typing import Any

import anyio
import psycopg
import pytest

import pgjobs
from pgjobs import App, AsyncClient, Client, Worker

JOBS = 20


def _app() -> App:
    app = App()

    @app.job("call", queue="rq", rate_key=lambda payload: f"host:{payload['host']}")
    async def call(payload: Any, ctx: pgjobs.JobContext) -> None:
        return None

    return app


def test_a_rate_limited_backlog_runs_at_the_limit_not_at_the_poll_interval(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    app = _app()
    with Client(dsn, app=app) as client:
        limit = client.configure_rate_limit("host:a", 10, 1.0)
        assert limit is not None and limit.max_starts == 10
        ids = [client.enqueue("call", {"host": "a"}).id for _ in range(JOBS)]
    assert conn.execute("SELECT count(*) FROM pgjobs.jobs WHERE rate_key = 'host:a'").fetchone() == (JOBS,)
    worker = Worker(app, dsn, {"rq": 10}, poll_interval=60, lease=120, scheduler=False, vacuum=False)

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            try:
                with anyio.fail_after(40):
                    while worker.completed < JOBS:
                        await anyio.sleep(0.01)
            finally:
                worker.stop()

    anyio.run(main)
    starts = [
        r[0]
        for r in conn.execute(
            "SELECT first_started_at FROM pgjobs.jobs WHERE id = ANY (%s) ORDER BY first_started_at", [ids]
        )
    ]
    assert len(starts) == JOBS
    # 10 in any second: the 11th start comes a second after the first at the earliest, on the claims' clocks
    assert (starts[10] - starts[0]).total_seconds() >= 1.0
    assert all((starts[i + 10] - starts[i]).total_seconds() >= 1.0 for i in range(JOBS - 10))
    # no busy waiting: about one claim per start (a wake that finds the token taken by its own earlier claim
    # costs one more), never a claim loop
    assert worker.claim_calls <= 3 * JOBS, (worker.claim_calls, worker.claims_by_trigger)


def test_the_async_client_configures_limits_and_enqueues_with_a_key(dsn: str) -> None:
    async def main() -> None:
        async with AsyncClient(dsn) as client:
            await client.configure_rate_limit("k", 5, 2.0, burst=1)
            settings = await client.configure_queue("q", max_starts=3, per=1.0)
            assert settings.queue == "q"
            job = await client.enqueue("x", queue="q", rate_key="k")
            limits = {(r.scope, r.key): r for r in await client.rate_limits()}
            # an empty window: max_starts + burst tokens
            assert limits[("key", "k")].burst == 1 and limits[("key", "k")].tokens == 6
            assert limits[("queue", "q")].max_starts == 3
            why = await client.explain(job.id)
            assert why is not None
            assert await client.configure_rate_limit("k", 0) is None
            await client.configure_queue("q", max_starts=0)
            assert await client.rate_limits() == []

    anyio.run(main)


def test_a_declared_rate_key_applies_to_every_enqueue_path_and_an_explicit_one_wins(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    app = App()

    @app.job("fixed", rate_key="shared")
    async def fixed(payload: Any, ctx: pgjobs.JobContext) -> None: ...

    @app.job("per_host", rate_key=lambda p: p.get("host"))
    async def per_host(payload: Any, ctx: pgjobs.JobContext) -> None: ...

    with Client(dsn, app=app) as client:
        a = client.enqueue("fixed").id
        b = client.enqueue("per_host", {"host": "h1"}).id
        c = client.enqueue("per_host", {}).id  # the function gave None: no key
        d = client.enqueue("fixed", rate_key="mine").id
        many = [r.id for r in client.enqueue_many([{"kind": "per_host", "payload": {"host": "h2"}}, {"kind": "fixed"}])]
        e = app.handlers["per_host"].enqueue(client, {"host": "h3"}).id
    keys = dict(conn.execute("SELECT id, rate_key FROM pgjobs.jobs").fetchall())
    assert [keys[i] for i in (a, b, c, d, *many, e)] == ["shared", "h1", None, "mine", "h2", "shared", "h3"]
    with pytest.raises(ValueError, match="rate_key"):
        app.job("bad", rate_key="")

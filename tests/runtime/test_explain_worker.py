"""explain() against a real Worker: its heartbeat's meta (queues, kinds, heartbeat interval) is what the
no_worker check reads, and a job it runs is explained as running on it."""

from __future__ import annotations

from typing import Any

import anyio

import pgjobs
from pgjobs import App, AsyncClient, Worker
from pgjobs.client.explain import Reason
from tests.runtime.test_worker import run_worker


def test_a_running_worker_serves_its_queue_and_kinds_only(dsn: str) -> None:
    app = App()
    release = anyio.Event()

    @app.job("mail.send", queue="mail")
    async def send(payload: Any, ctx: pgjobs.JobContext) -> None:
        await release.wait()

    async def body(worker: Worker, client: AsyncClient) -> None:
        other_kind = await client.enqueue("mail.digest", queue="mail")
        other_queue = await client.enqueue("mail.send", queue="bulk")
        why = await client.explain(other_kind.id)
        assert why is not None and why.reason is Reason.NO_WORKER
        assert (why.details["live_workers"], why.details["queue_workers"]) == (1, 1)
        why = await client.explain(other_queue.id)
        assert why is not None and why.reason is Reason.NO_WORKER and why.details["queue_workers"] == 0
        job = await client.enqueue("mail.send", queue="mail")
        with anyio.fail_after(30):
            while (why := await client.explain(job.id)) is not None and why.reason is not Reason.RUNNING:
                await anyio.sleep(0.05)
        assert why is not None and why.details["worker"] == worker.name and why.details["worker_live"] is True
        release.set()

    run_worker(app, dsn, body, queues={"mail": 2})
    with pgjobs.Client(dsn) as client:
        # the worker deregistered as it stopped: nobody serves the queue any more
        (pending,) = client.list_jobs(queue="mail", kind="mail.digest")
        why = client.explain(pending.id)
        assert why is not None and why.reason is Reason.NO_WORKER and why.details["live_workers"] == 0

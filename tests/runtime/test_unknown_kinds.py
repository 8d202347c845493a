"""A job of a kind no worker handles does not wait in silence: the worker that serves its queue warns in its
log, once per kind, and leaves the job alone."""

from __future__ import annotations

import logging
from typing import Any

import anyio
import pytest

import pgjobs
from pgjobs import App, AsyncClient, JobState, Worker
from tests.runtime.test_worker import run_worker, wait_state


def test_the_worker_warns_once_per_kind_no_live_worker_handles(dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    app = App()

    @app.job("known")
    async def known(payload: Any, ctx: pgjobs.JobContext) -> None:
        return None

    seen: dict[str, Any] = {}

    async def body(worker: Worker, client: AsyncClient) -> None:
        mystery = [(await client.enqueue("mystery_kind", {})).id for _ in range(3)]
        elsewhere = await client.enqueue("mystery_kind", {}, queue="not_served")
        done = await client.enqueue("known", {})
        await wait_state(client, done.id, JobState.SUCCEEDED)
        with anyio.fail_after(30):
            while ("default", "mystery_kind") not in worker.unhandled_seen:
                await anyio.sleep(0.02)
            # two more checks of the same queue: no second warning
            target = worker.heartbeats + 2 * 6
            while worker.heartbeats < target:
                await anyio.sleep(0.02)
        seen["states"] = [(await client.job_status(i)).state for i in [*mystery, elsewhere.id]]  # type: ignore[union-attr]
        seen["unhandled"] = set(worker.unhandled_seen)

    with caplog.at_level(logging.WARNING, logger="pgjobs.worker"):
        run_worker(app, dsn, body, heartbeat_interval=0.05)
    warnings = [r for r in caplog.records if getattr(r, "event", None) == "worker.unhandled_kind"]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    message = warnings[0].getMessage()
    assert "'mystery_kind'" in message and "'default'" in message and "no live worker handles this kind" in message
    assert "declares known" in message and "3 such job(s)" in message
    assert seen["states"] == [JobState.PENDING] * 4  # left alone
    assert seen["unhandled"] == {("default", "mystery_kind")}  # only its own queues

"""The traceback a failed attempt stores starts at the handler's own frames: the runner's and anyio's
frames before it are left out (a line says how many), everything from the handler on is kept."""

from __future__ import annotations

import json
from typing import Any

import psycopg

import pgjobs
from pgjobs import App, AsyncClient, JobState, Worker
from pgjobs.testing import perform_job
from tests.runtime.test_worker import run_worker, wait_state

HERE = __file__


def _app() -> App:
    app = App()

    @app.job("sync_boom", max_attempts=1)
    def sync_boom(payload: Any, ctx: pgjobs.SyncJobContext) -> None:
        json.loads("{bad")  # a library frame under the handler's: kept

    @app.job("async_boom", max_attempts=1)
    async def async_boom(payload: Any, ctx: pgjobs.JobContext) -> None:
        raise ValueError("boom")

    return app


def _frames(text: str) -> list[str]:
    return [line.split('"')[1] for line in text.splitlines() if line.startswith('  File "')]


def _assert_starts_at_the_handler(text: str, handler: str, last: str) -> None:
    lines = text.splitlines()
    assert lines[0] == "Traceback (most recent call last):", text
    assert "left out)" in lines[1] and "of the pgjobs worker and anyio" in lines[1], text
    frames = _frames(text)
    assert frames[0] == HERE and f"in {handler}" in text.splitlines()[2], text
    assert not any("/pgjobs/runtime/" in f or "/anyio/" in f for f in frames), frames
    assert lines[-1] == last


def test_a_failed_attempt_stores_the_handlers_frames_first(dsn: str) -> None:
    ids: dict[str, int] = {}

    async def body(worker: Worker, client: AsyncClient) -> None:
        for kind in ("sync_boom", "async_boom"):
            ids[kind] = (await client.enqueue(kind, {}, max_attempts=1)).id
        for kind, job_id in ids.items():
            st = await wait_state(client, job_id, JobState.FAILED)
            assert st.last_error is not None
            if kind == "sync_boom":
                _assert_starts_at_the_handler(
                    st.last_error, "sync_boom", "json.decoder.JSONDecodeError: Expecting property name enclosed in"
                    " double quotes: line 1 column 2 (char 1)",
                )  # fmt: skip
                assert any(f.endswith("json/decoder.py") for f in _frames(st.last_error))
                assert "(4 frames of" in st.last_error
            else:
                _assert_starts_at_the_handler(st.last_error, "async_boom", "ValueError: boom")
            assert st.errors[-1]["error"] == st.last_error

    run_worker(_app(), dsn, body)


def test_perform_job_stores_the_same_text(conn: psycopg.Connection[Any]) -> None:
    done = perform_job(_app(), "async_boom", {}, conn=conn)
    assert done.job.last_error is not None
    lines = done.job.last_error.splitlines()
    assert _frames(done.job.last_error)[0] == HERE and lines[-1] == "ValueError: boom"
    assert not any("/pgjobs/" in f or "/anyio/" in f for f in _frames(done.job.last_error))

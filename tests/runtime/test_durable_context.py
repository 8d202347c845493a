"""The durable context calls in process (pgjobs.testing.perform_job, a real database): a step name used twice,
a result that is not JSON, a step result read back as JSON, and a park that ends the attempt."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import pgjobs
from pgjobs.testing import perform_job

app = pgjobs.App()
runs: list[str] = []


@app.job("twice")
def twice(payload: Any, ctx: pgjobs.SyncJobContext) -> None:
    ctx.step("same", runs.append, "first")
    ctx.step("same", runs.append, "second")


@app.job("not_json")
def not_json(payload: Any, ctx: pgjobs.SyncJobContext) -> None:
    ctx.step("set", lambda: {1, 2})


@app.job("tuple_step")
async def tuple_step(payload: Any, ctx: pgjobs.JobContext) -> Any:
    return await ctx.step("pair", lambda: (1, 2))


@app.job("parks")
async def parks(payload: Any, ctx: pgjobs.JobContext) -> None:
    await ctx.wait_for("never:in-process", timeout=3600)


def test_a_step_name_used_twice_is_a_clear_error(conn: psycopg.Connection[Any]) -> None:
    runs.clear()
    done = perform_job(app, "twice", conn=conn)
    assert isinstance(done.exception, ValueError) and "'same'" in str(done.exception)
    assert runs == ["first"]


def test_a_result_that_is_not_json_fails_the_step(conn: psycopg.Connection[Any]) -> None:
    done = perform_job(app, "not_json", conn=conn)
    assert isinstance(done.exception, TypeError) and "step 'set'" in str(done.exception)
    assert conn.execute("SELECT count(*) FROM pgjobs.job_steps").fetchone() == (0,)


def test_a_step_returns_what_a_later_attempt_reads(conn: psycopg.Connection[Any]) -> None:
    done = perform_job(app, "tuple_step", conn=conn).raise_for_error()
    assert done.result == [1, 2]
    row = conn.execute("SELECT result FROM pgjobs.job_steps WHERE job_id = %s", [done.id]).fetchone()
    assert row == ([1, 2],)


def test_a_park_ends_the_attempt_without_spending_it(conn: psycopg.Connection[Any]) -> None:
    done = perform_job(app, "parks", conn=conn)
    assert isinstance(done.exception, pgjobs.Parked) and done.exception.outcome == "parked"
    assert (done.state, done.job.attempt, done.job.lease_token) == (pgjobs.JobState.SCHEDULED, 0, None)


def test_wait_result_tells_a_timeout_from_a_signal() -> None:
    timed_out = pgjobs.WaitResult("k", None, True)
    signalled = pgjobs.WaitResult("k", None, False)  # a signal may carry JSON null
    assert timed_out.timed_out and not signalled.timed_out
    with pytest.raises(AttributeError):
        timed_out.timed_out = False  # type: ignore[misc]

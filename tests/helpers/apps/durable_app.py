"""A worker process for tests/runtime/test_durable_worker.py: handlers with durable steps, sleeps and signal waits.

``python tests/helpers/apps/durable_app.py DSN '{"queues": {...}, "lease": ..., ...}'`` runs
``Worker(app, DSN, **options)`` with ``run_sync()`` and exits with its return code.

The side tables (created by the tests): ``step_runs(job_id, step)`` gets a row every time a step's function
runs; ``hangs(job_id, after_step, used)`` makes the handler hang (to be killed) right after that step is
recorded, once; ``woken(job_id, payload, timed_out)`` gets a row every time a wait returns.

* ``three_steps`` (async): steps a, b, c; returns their results.
* ``sync_steps`` (sync): the same through the sync context.
* ``waiter`` (async): ``wait_for(payload["key"], timeout=payload.get("timeout"))``.
* ``sync_waiter`` (sync): a step, a sleep of ``payload["sleep"]`` s, then the wait.
* ``sleeper`` (async): ``sleep(payload["seconds"])``.
* ``noop`` (async).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

import psycopg

import pgjobs

app = pgjobs.App()
DSN = ""


def _run_step(job_id: int, step: str) -> dict[str, Any]:
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute("INSERT INTO step_runs (job_id, step) VALUES (%s, %s)", (job_id, step))
    return {"step": step, "job": job_id}


def _hang_after(job_id: int, step: str) -> None:
    with psycopg.connect(DSN, autocommit=True) as conn:
        hit = conn.execute(
            "UPDATE hangs SET used = true WHERE job_id = %s AND after_step = %s AND NOT used RETURNING 1",
            (job_id, step),
        ).fetchone()
    if hit:
        time.sleep(3600)  # killed here, the step recorded


def _woken(job_id: int, result: pgjobs.WaitResult) -> None:
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO woken (job_id, payload, timed_out) VALUES (%s, %s, %s)",
            (job_id, json.dumps(result.payload), result.timed_out),
        )


@app.job("three_steps", max_attempts=10)
async def three_steps(payload: Any, ctx: pgjobs.JobContext) -> list[Any]:
    out = []
    for step in ("a", "b", "c"):
        out.append(await ctx.step(step, _run_step, ctx.id, step))
        _hang_after(ctx.id, step)
    return out


@app.job("sync_steps", max_attempts=10)
def sync_steps(payload: Any, ctx: pgjobs.SyncJobContext) -> list[Any]:
    out = []
    for step in ("a", "b", "c"):
        out.append(ctx.step(step, _run_step, ctx.id, step))
        _hang_after(ctx.id, step)
    return out


@app.job("waiter")
async def waiter(payload: dict[str, Any], ctx: pgjobs.JobContext) -> dict[str, Any]:
    result = await ctx.wait_for(payload["key"], timeout=payload.get("timeout"))
    _woken(ctx.id, result)
    return {"payload": result.payload, "timed_out": result.timed_out}


@app.job("sync_waiter")
def sync_waiter(payload: dict[str, Any], ctx: pgjobs.SyncJobContext) -> dict[str, Any]:
    first = ctx.step("first", _run_step, ctx.id, "first")
    ctx.sleep(payload.get("sleep", 0.2))
    result = ctx.wait_for(payload["key"], timeout=payload.get("timeout"))
    _woken(ctx.id, result)
    return {"first": first, "payload": result.payload, "timed_out": result.timed_out}


@app.job("sleeper")
async def sleeper(payload: dict[str, Any], ctx: pgjobs.JobContext) -> str:
    await ctx.sleep(float(payload["seconds"]))
    return "slept"


@app.job("noop")
async def noop(payload: Any, ctx: pgjobs.JobContext) -> None:
    return None


def main() -> int:
    global DSN
    DSN = sys.argv[1]
    options: dict[str, Any] = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    options.setdefault("scheduler", False)
    worker = pgjobs.Worker(app, DSN, **options)
    print(f"worker {worker.name} starting", flush=True)
    return worker.run_sync()


if __name__ == "__main__":
    sys.exit(main())

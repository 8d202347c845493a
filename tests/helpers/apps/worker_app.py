"""A worker process for tests/runtime/test_worker_processes.py and tests/client/test_stream.py.

``python tests/helpers/apps/worker_app.py DSN '{"queues": {...}, "lease": ..., ...}'``
runs ``Worker(app, DSN, **options)``
with ``run_sync()`` (SIGINT/SIGTERM -> graceful stop) and exits with its return code.

The handlers:

* ``effect``: the idempotent handler pattern. The side effect (a row in ``effects``) and the record that this
  job did it (the row's ``job_id``, unique) commit in one transaction of the handler's own; a re-run after a
  crash finds the row and does nothing twice. With ``{"hang": true}`` the first attempt hangs *inside* that
  transaction after writing a marker row (autocommit) so the test knows when to kill the process; with
  ``{"hang_after_commit": true}`` it hangs right after the transaction committed.
* ``sleep``: sleeps ``payload["seconds"]`` (async).
* ``noop``: returns None.
* ``steps``: reports progress, fails its first attempt with ``Retry(after=0.2)``, then succeeds.
* ``hold``: runs until the test puts the job's id in table ``releases`` (the test says when it ends).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

import anyio
import psycopg

import pgjobs

app = pgjobs.App()
DSN = ""


@app.job("effect")
def effect(payload: dict[str, Any], ctx: pgjobs.SyncJobContext) -> str:
    with psycopg.connect(DSN) as conn, conn.transaction():
        # The unique job_id is the idempotency record: a second attempt cannot commit the effect again.
        cur = conn.execute(
            "INSERT INTO effects (job_id, attempt, worker) VALUES (%s, %s, %s) ON CONFLICT (job_id) DO NOTHING",
            (ctx.id, ctx.attempt, ctx.worker_name),
        )
        if payload.get("hang") and ctx.attempt == 1:
            _mark(ctx.id, "in transaction")
            time.sleep(3600)  # killed here: the effect above never commits
        applied = cur.rowcount == 1
    if payload.get("hang_after_commit") and ctx.attempt == 1:
        _mark(ctx.id, "committed")
        time.sleep(3600)  # killed here: the effect committed, the job was never reported
    return "effect applied" if applied else "effect already applied"


def _mark(job_id: int, what: str) -> None:
    with psycopg.connect(DSN, autocommit=True) as marker:
        marker.execute("INSERT INTO markers (job_id, what) VALUES (%s, %s)", (job_id, what))


@app.job("sleep")
async def sleep(payload: dict[str, Any], ctx: pgjobs.JobContext) -> str:
    await anyio.sleep(float(payload.get("seconds", 1)))
    return "slept"


@app.job("noop")
async def noop(payload: Any, ctx: pgjobs.JobContext) -> None:
    return None


@app.job("steps")
async def steps(payload: Any, ctx: pgjobs.JobContext) -> str:
    await ctx.report_progress({"attempt": ctx.attempt, "pct": 50})
    if ctx.attempt == 1:
        raise pgjobs.Retry(after=0.2)
    return "done"


@app.job("hold")
async def hold(payload: Any, ctx: pgjobs.JobContext) -> str:
    async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
        while not await (await conn.execute("SELECT 1 FROM releases WHERE job_id = %s", [ctx.id])).fetchone():
            await anyio.sleep(0.05)
    return "released"


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

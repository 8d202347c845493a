"""A worker process for tests/chaos/test_chaos.py (the database server is crashed and restarted under it).

``python tests/helpers/apps/chaos_app.py DSN '{"queues": {...}, "lease": ..., ...}'``
runs ``Worker(app, DSN, **options)``
with ``run_sync()`` and exits with its return code. The test checks that the process never exits by itself.

The handlers:

* ``effect``: the documented idempotent pattern (README, "Handlers must be idempotent"): the side effect (a row in
  ``effects``, whose ``job_id`` is unique) commits in one transaction of the handler's own, so a re-run after a
  crash finds the row and does nothing twice. The handler keeps one connection per thread and opens a new one
  when the server killed it (the attempt then fails and the job is retried by the SQL backoff). ``{"sleep": s}``
  works ``s`` seconds before the effect.
* ``hold``: the first attempt saves a checkpoint, writes a marker (so the test knows it runs) and then waits
  ``payload["hold"]`` seconds (3600 by default: it never finishes unless released by ``{"hold": small}``);
  every attempt returns what it found: ``{"attempt", "checkpoint"}``.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from typing import Any

import anyio
import psycopg

import pgjobs

app = pgjobs.App()
DSN = ""
_local = threading.local()


def _conn() -> psycopg.Connection[Any]:
    conn: psycopg.Connection[Any] | None = getattr(_local, "conn", None)
    if conn is None or conn.closed or conn.broken:
        conn = psycopg.connect(DSN, autocommit=True, connect_timeout=5, application_name="chaos-handler")
        _local.conn = conn
    return conn


@app.job("effect")
def effect(payload: dict[str, Any], ctx: pgjobs.SyncJobContext) -> str:
    if payload.get("sleep"):
        time.sleep(float(payload["sleep"]))  # "work" before the effect, so a load lasts long enough to hit
    conn = _conn()
    with conn.transaction():
        # The unique job_id is the idempotency record: a second attempt cannot commit the effect again.
        applied = conn.execute(
            "INSERT INTO effects (job_id, attempt, worker) VALUES (%s, %s, %s) ON CONFLICT (job_id) DO NOTHING",
            (ctx.id, ctx.attempt, ctx.worker_name),
        ).rowcount
    return "effect applied" if applied else "effect already applied"


@app.job("hold")
async def hold(payload: dict[str, Any], ctx: pgjobs.JobContext) -> dict[str, Any]:
    seen = ctx.checkpoint
    if seen is None:
        await ctx.save_checkpoint({"saved_by_attempt": ctx.attempt})
        async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as marker:
            await marker.execute("INSERT INTO markers (job_id, what) VALUES (%s, 'checkpointed')", (ctx.id,))
        await anyio.sleep(float(payload.get("hold", 3600)))
    return {"attempt": ctx.attempt, "checkpoint": seen}


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

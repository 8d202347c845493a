"""A worker process for tests/chaos/test_failover.py (its primary is killed and a standby promoted under it).

``python tests/helpers/apps/failover_app.py DSN '{"lease": ..., ...}'`` runs ``Worker(app, DSN, **options)`` with
``run_sync()``; DSN is the multi-host ``host=a,b ... target_session_attrs=read-write``.

The handlers:

* ``effect``: records each run in ``runs`` (job id, attempt, worker), in a transaction of the handler's own, before
  the worker completes the job: a job run twice (a claim the failover lost) shows two rows. A lost connection is
  retried here (the server is failing over) rather than failing the attempt.
* ``tick`` (code-defined schedule ``tick``, every second): the same, so the schedule's runs are counted too.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

import psycopg

import pgjobs
from pgjobs.runtime.logs import configure_logging

app = pgjobs.App()
DSN = ""
_local = threading.local()


def _record(job_id: int, attempt: int, worker: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        conn: psycopg.Connection[Any] | None = getattr(_local, "conn", None)
        try:
            if conn is None or conn.closed or conn.broken:
                conn = psycopg.connect(DSN, autocommit=True, connect_timeout=2, application_name="failover-handler")
                _local.conn = conn
            conn.execute("INSERT INTO runs (job_id, attempt, worker) VALUES (%s, %s, %s)", (job_id, attempt, worker))
            return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@app.job("effect")
def effect(payload: dict[str, Any], ctx: pgjobs.SyncJobContext) -> None:
    _record(ctx.id, ctx.attempt, ctx.worker_name)


@app.periodic(cron="* * * * * *", name="tick")
def tick(payload: Any, ctx: pgjobs.SyncJobContext) -> None:
    _record(ctx.id, ctx.attempt, ctx.worker_name)


def main() -> int:
    global DSN
    DSN = sys.argv[1]
    options: dict[str, Any] = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    configure_logging("INFO")  # as `pgjobs worker` does (psycopg_pool's per-retry lines folded into ours)
    worker = pgjobs.Worker(app, DSN, **options)
    print(f"worker {worker.name} starting", flush=True)
    return worker.run_sync()


if __name__ == "__main__":
    sys.exit(main())

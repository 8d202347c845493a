"""The processes of tests/ops/test_upgrade_under_load.py: ``python upgrade_app.py MODE DSN NAME``.

It imports whatever ``pgjobs`` comes first on ``PYTHONPATH``: the test runs it from an old checkout's tree (the
code deployed before the upgrade) and from this one (after). Modes:

* ``worker``: a ``pgjobs.Worker`` (SIGTERM: graceful stop) whose ``witness`` handler writes the witness row;
* ``rated``: the same worker on the queues ``rk`` and ``rq`` (the rate-limited upgrade: a key's limit, a queue's);
* ``sqlworker``: for a revision whose Python has no usable worker: the SQL contract by hand (``claim``, the
  witness row, ``complete``), every error logged and the loop going on after a pause (what a careful
  client in another language does); stops on SIGTERM;
* ``producer``: enqueues a ``witness`` job every few milliseconds, recording its id in ``public.enqueued`` in
  the same transaction (so the table holds exactly the jobs that exist); errors are logged and retried;
  stops on SIGTERM.

The witness: ``public.witness(job_id PRIMARY KEY)`` written by the handler in a transaction of its own; a second
run of the same job cannot insert again, and records itself in ``public.doubles`` instead.
"""

from __future__ import annotations

import inspect
import signal
import sys
import time
from typing import Any

import psycopg

STOP = False


def _on_term(signum: int, frame: Any) -> None:
    global STOP
    STOP = True


def witness(dsn: str, job_id: int, attempt: int, worker: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        try:
            conn.execute(
                "INSERT INTO public.witness (job_id, attempt, worker) VALUES (%s, %s, %s)", (job_id, attempt, worker)
            )
        except psycopg.errors.UniqueViolation:
            conn.execute(
                "INSERT INTO public.doubles (job_id, attempt, worker) VALUES (%s, %s, %s)", (job_id, attempt, worker)
            )
            return "ran twice"
    return "witnessed"


def run_rated(dsn: str, name: str) -> int:
    return run_worker(dsn, name, {"rk": 8, "rq": 8})


def run_worker(dsn: str, name: str, queues: dict[str, int] | None = None) -> int:
    import pgjobs

    app = pgjobs.App()

    @app.job("witness")
    def handler(payload: Any, ctx: Any) -> str:
        return witness(dsn, ctx.id, ctx.attempt, name)

    options: dict[str, Any] = {
        "queues": queues or {"default": 8}, "lease": 60.0, "scheduler": False, "name": name, "poll_interval": 0.5,
        "grace_period": 10.0,
    }  # fmt: skip
    accepted = inspect.signature(pgjobs.Worker).parameters
    worker = pgjobs.Worker(app, dsn, **{k: v for k, v in options.items() if k in accepted})
    print(f"worker {name} ({pgjobs.__file__}) starting", flush=True)
    return int(worker.run_sync() or 0)


def run_sqlworker(dsn: str, name: str) -> int:
    signal.signal(signal.SIGTERM, _on_term)
    print(f"sql worker {name} starting", flush=True)
    conn: psycopg.Connection[Any] | None = None
    while not STOP:
        try:
            if conn is None or conn.closed:
                conn = psycopg.connect(dsn, autocommit=True)
            rows = conn.execute(
                "SELECT id, attempt, lease_token FROM pgjobs.claim(worker => %s, queues => '{default}',"
                " max_jobs => 8, lease => '60 seconds')",
                (name,),
            ).fetchall()
            for job_id, attempt, token in rows:
                witness(dsn, job_id, attempt, name)
                _complete(dsn, job_id, token, name)
            if not rows:
                time.sleep(0.05)
        except psycopg.Error as exc:
            print(f"sql worker {name}: {type(exc).__name__}: {str(exc).splitlines()[0]}", flush=True)
            time.sleep(0.1)
    return 0


def _complete(dsn: str, job_id: int, token: Any, name: str) -> None:
    """``complete`` until it answers (a lease-token compare-and-set: running it again is safe)."""
    while True:
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("SELECT pgjobs.complete(id => %s, lease_token => %s)", (job_id, token))
                return
        except psycopg.Error as exc:
            print(f"sql worker {name}: complete {job_id}: {type(exc).__name__}: {str(exc).splitlines()[0]}", flush=True)
            time.sleep(0.1)


def run_producer(dsn: str, name: str) -> int:
    signal.signal(signal.SIGTERM, _on_term)
    print(f"producer {name} starting", flush=True)
    conn: psycopg.Connection[Any] | None = None
    n = 0
    while not STOP:
        try:
            if conn is None or conn.closed:
                conn = psycopg.connect(dsn, autocommit=True)
            with conn.transaction():
                row = conn.execute(
                    "SELECT id FROM pgjobs.enqueue(kind => 'witness', payload => %s::jsonb)", (f'{{"n": {n}}}',)
                ).fetchone()
                assert row is not None
                conn.execute("INSERT INTO public.enqueued (job_id) VALUES (%s)", (row[0],))
            n += 1
            time.sleep(0.005)
        except psycopg.Error as exc:
            print(f"producer {name}: {type(exc).__name__}: {str(exc).splitlines()[0]}", flush=True)
            time.sleep(0.05)
    print(f"producer {name} enqueued {n}", flush=True)
    return 0


def main() -> int:
    # ``pgjobs`` is what PYTHONPATH says: the checkout's editable install maps it here through a finder that would
    # also answer, with this checkout's code, for a submodule an old tree lacks
    sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in type(f).__module__]
    mode, dsn, name = sys.argv[1], sys.argv[2], sys.argv[3]
    modes = {"worker": run_worker, "rated": run_rated, "sqlworker": run_sqlworker, "producer": run_producer}
    return modes[mode](dsn, name)


if __name__ == "__main__":
    sys.exit(main())

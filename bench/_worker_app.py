"""The bench's worker process: ``python -m bench._worker_app DSN QUEUE CONCURRENCY [non-durable-completions]``.

A real ``pgjobs.Worker`` (no scheduler) with two handlers: ``noop`` (returns None) and ``stamp`` (returns
``time.time()`` at its start, for the wake-latency figure). Stops gracefully on SIGTERM.

With ``PGJOBS_BENCH_COUNT_FILE`` set, the number of jobs its handlers have run is written to that file
(replaced whole, every 200 ms): ``bench soak`` reads its completion rate and depth from it, not from a count
over the jobs table, which a held snapshot makes O(dead versions) (see bench/soak.py).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

import pgjobs

app = pgjobs.App()
_ran = [0]  # jobs the handlers have run (one event loop: no lock needed)


@app.job("noop")
async def noop(payload: Any, ctx: pgjobs.JobContext) -> None:
    _ran[0] += 1
    return None


@app.job("stamp")
async def stamp(payload: Any, ctx: pgjobs.JobContext) -> float:
    _ran[0] += 1
    return time.time()


def _write_count(path: str) -> None:
    tmp = f"{path}.tmp"
    while True:
        with open(tmp, "w") as out:
            out.write(str(_ran[0]))
        os.replace(tmp, path)
        time.sleep(0.2)


def main() -> int:
    dsn, queue, concurrency = sys.argv[1], sys.argv[2], int(sys.argv[3])
    durable = not (len(sys.argv) > 4 and sys.argv[4] == "non-durable-completions")
    if count_file := os.environ.get("PGJOBS_BENCH_COUNT_FILE"):
        threading.Thread(target=_write_count, args=(count_file,), daemon=True).start()
    worker = pgjobs.Worker(
        app, dsn, {queue: concurrency}, scheduler=False, grace_period=5.0, durable_completions=durable
    )
    return worker.run_sync()


if __name__ == "__main__":
    sys.exit(main())

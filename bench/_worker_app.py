"""The bench's worker process: ``python -m bench._worker_app DSN QUEUE CONCURRENCY [non-durable-completions]``.

A real ``pgjobs.Worker`` (no scheduler) with two handlers: ``noop`` (returns None) and ``stamp`` (returns
``time.time()`` at its start, for the wake-latency figure). Stops gracefully on SIGTERM.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import pgjobs

app = pgjobs.App()


@app.job("noop")
async def noop(payload: Any, ctx: pgjobs.JobContext) -> None:
    return None


@app.job("stamp")
async def stamp(payload: Any, ctx: pgjobs.JobContext) -> float:
    return time.time()


def main() -> int:
    dsn, queue, concurrency = sys.argv[1], sys.argv[2], int(sys.argv[3])
    durable = not (len(sys.argv) > 4 and sys.argv[4] == "non-durable-completions")
    worker = pgjobs.Worker(
        app, dsn, {queue: concurrency}, scheduler=False, grace_period=5.0, durable_completions=durable
    )
    return worker.run_sync()


if __name__ == "__main__":
    sys.exit(main())

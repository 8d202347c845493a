"""The bench's status-stream follower: ``python -m bench._follower DSN QUEUE OUT``.

Follows ``client.subscribe(queue=QUEUE)`` until SIGTERM, then writes to OUT (JSON) how many events it saw and
each event's delivery delay: the wall clock at receipt minus the event's ``at`` (the transition's transaction
start, a few hundred microseconds before its commit: the delay is slightly overstated, never understated).
Same machine, same clock as the server.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import anyio

from pgjobs import AsyncClient


async def follow(dsn: str, queue: str, out: str) -> None:
    delays: list[float] = []
    stop = anyio.Event()

    def on_term(*_: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_term)

    async def consume() -> None:
        async with AsyncClient(dsn, min_size=1, max_size=1) as client:
            poll = float(os.environ.get("BENCH_FOLLOWER_POLL", "1.0"))
            async for ev in client.subscribe(queue=queue, poll_interval=poll):
                if ev.at is not None:
                    delays.append(time.time() - ev.at.timestamp())

    async with anyio.create_task_group() as tg:
        tg.start_soon(consume)
        while not stop.is_set():
            await anyio.sleep(0.05)
        tg.cancel_scope.cancel()
    with open(out, "w") as f:
        json.dump({"events": len(delays), "delays": delays}, f)


def main() -> int:
    anyio.run(follow, sys.argv[1], sys.argv[2], sys.argv[3])
    return 0


if __name__ == "__main__":
    sys.exit(main())

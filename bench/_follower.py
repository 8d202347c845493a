"""The bench's status-stream follower: ``python -m bench._follower DSN QUEUE PROBE_KIND OUT``.

Follows ``client.subscribe(queue=QUEUE)`` until SIGTERM, then writes to OUT (JSON):

* ``events`` / ``delays``: how many events of the worker's jobs it saw, and for each the wall clock at
  receipt minus the event's ``at``. ``at`` is the transition's ``now()``, its transaction's start: for the
  worker's one-statement transactions that is the statement's start, so this figure also counts the claim
  or completion statement itself and its commit (WAL flush), and overstates the delivery time.
* ``probes``: receipt time per job id of PROBE_KIND's events: the bench's probe enqueues (see
  bench/worker.py) whose commit instant it knows, for the honest commit -> receipt figure.
* ``cpu``: CPU seconds used by this process and by its connection's backend (from /proc).
* ``trace`` (with ``BENCH_FOLLOWER_TRACE=1``): per read_events round trip, (start, SQL done, parsed, rows,
  why: connect/hint/chase/poll), and per hint its arrival time: where the delivery time goes.

Same machine, same clock as the server.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import AsyncGenerator
from typing import Any

import anyio

import pgjobs.client.stream as stream_mod
from pgjobs import AsyncClient
from pgjobs.client.listen import Listener, ListenEvent, Notifications, Tick
from pgjobs.records import JobState

TRACE: dict[str, Any] = {"reads": [], "hints": [], "backends": []}
_why = ["connect"]


def _install_trace() -> None:
    """Replaces the stream's read with a timed copy of it, and wraps its listener (diagnostics only). The read
    runs in an explicit transaction so that its COMMIT (the tick's WAL flush) is timed apart from the
    statement: reads = (start, statement done, rows converted, committed, events built, rows, why)."""

    states: dict[str, Any] = getattr(stream_mod, "_STATES", None) or {s.value: s for s in JobState}

    async def read(self: Any, conn: Any, drain: bool = False) -> Any:
        self.read_started = time.monotonic()  # the chase's pacing (see subscribe)
        out: list[Any] = []
        while True:
            ids = None if self.ids is None else sorted(self.ids)
            t0 = time.time()
            async with conn.transaction():
                cur = await conn.execute(stream_mod._READ_SQL, (self.cursor, stream_mod._PAGE, self.queue, ids,
                                                                self.batch_id))  # fmt: skip
                t1 = time.time()
                rows = await cur.fetchall()
                t2 = time.time()
            t3 = time.time()
            head = rows[0][0] if rows else None
            got = [r for r in rows if r[1] is not None]
            self.last_page = len(got)
            for _, event_id, at, id_, state, q, kind, attempt, b, progress in got:
                self.cursor = max(self.cursor, event_id)
                ev = stream_mod.StatusEvent(id_, states[state], q, kind, attempt, b, progress, False,
                                            event_id, at)  # fmt: skip
                if self.wants(ev):
                    out.append(ev)
            TRACE["reads"].append((t0, t1, t2, t3, time.time(), len(got), _why[0]))
            _why[0] = "chase"
            if len(got) < stream_mod._PAGE:
                if head is not None:
                    self.cursor = max(self.cursor, head)
                return out
            if not drain:
                return out

    stream_mod._Stream.read = read  # type: ignore[method-assign]


def _install_listener_hook() -> None:
    """Notes each hint's arrival (for the trace) and the LISTEN connection's backend pid (for its CPU time)."""

    class TracingListener(Listener):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            if os.environ.get("BENCH_FOLLOWER_SYNC"):  # an experiment: every tick's commit waits for its flush
                self.options = "-c jit=off -c synchronous_commit=on"

        async def events(self, tick: float | None = None) -> AsyncGenerator[ListenEvent, None]:
            async for item in super().events(tick):
                if isinstance(item, Notifications):
                    TRACE["hints"].append((time.time(), [p for _, p in item.items]))
                    _why[0] = "hint"
                elif isinstance(item, Tick):
                    _why[0] = "poll"
                else:
                    _why[0] = "connect"
                    TRACE["backends"].append(item.conn.info.backend_pid)
                yield item

    stream_mod.Listener = TracingListener  # type: ignore[attr-defined]


async def follow(dsn: str, queue: str, probe_kind: str, out: str) -> None:
    delays: list[float] = []
    probes: dict[int, float] = {}
    stop = anyio.Event()

    def on_term(*_: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_term)

    async def consume() -> None:
        async with AsyncClient(dsn, min_size=1, max_size=1) as client:
            poll = float(os.environ.get("BENCH_FOLLOWER_POLL", "1.0"))
            chase = os.environ.get("BENCH_FOLLOWER_CHASE")  # seconds (experiments); default: subscribe()'s
            events = (
                client.subscribe(queue=queue, poll_interval=poll)
                if chase is None
                else stream_mod.subscribe(dsn, queue=queue, poll_interval=poll, chase_interval=float(chase))
            )
            async for ev in events:
                now = time.time()
                if ev.kind == probe_kind:
                    probes[ev.id] = now
                elif ev.at is not None:
                    delays.append(now - ev.at.timestamp())

    async with anyio.create_task_group() as tg:
        tg.start_soon(consume)
        while not stop.is_set():
            await anyio.sleep(0.05)
        tg.cancel_scope.cancel()
    data: dict[str, Any] = {"events": len(delays), "delays": delays, "probes": probes}
    if os.environ.get("BENCH_FOLLOWER_TRACE"):
        data["trace"] = TRACE
    data["cpu"] = {"follower": _cpu("self"), "backend": sum(_cpu(str(p)) for p in TRACE["backends"])}
    with open(out, "w") as f:
        json.dump(data, f)


def _cpu(pid: str) -> float:
    """CPU seconds (user + system) of a process so far, from /proc (0 when it is gone or unreadable)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def main() -> int:
    _install_listener_hook()
    if os.environ.get("BENCH_FOLLOWER_TRACE"):
        _install_trace()
    anyio.run(follow, sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4])
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Jobs nobody will run: the worker says so in its log, once per kind and queue.

A job of a kind no worker handles (a typo, a handler not deployed yet, a worker started without it) stays
pending forever, and nothing fails. Every few heartbeats the worker reads ``unhandled_kinds`` for its own
queues (the head of each queue in claim order, where such jobs collect: a bounded read) and warns about each
kind and queue it has not warned about yet. A worker does not claim such a job: it only reports it.
"""

from __future__ import annotations

import logging

from pgjobs.client.workers import unhandled_kinds_call
from pgjobs.runtime.state import WorkerState

log = logging.getLogger("pgjobs.worker")

CHECK_EVERY = 6  # heartbeats; the first check comes with the first heartbeat after the start
SAMPLE = 200  # jobs read at the head of each queue


async def report_unhandled(w: WorkerState) -> None:
    """Warns once per (queue, kind) about claimable jobs no live worker takes, in this worker's queues."""
    w.heartbeats += 1
    if (w.heartbeats - 1) % CHECK_EVERY:
        return
    for row in await w.call(unhandled_kinds_call(sorted(w.queues), SAMPLE)):
        key = (row.queue, row.kind)
        if key in w.unhandled_seen:
            continue
        w.unhandled_seen.add(key)
        log.warning(
            "jobs of kind %r wait in queue %r and will not run: %s (this worker's app declares %s; %d such job(s)"
            " at the head of the queue)",
            row.kind, row.queue, row.reason, ", ".join(sorted(w.app.kinds)) or "no kinds", row.jobs,
            extra={"event": "worker.unhandled_kind", "kind": row.kind, "queue": row.queue},
        )  # fmt: skip

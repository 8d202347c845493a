"""Reporting outcomes: the batched completer, and the one-job reports (fail, release, ack_cancel).

The **completer** runs on its own connection: whatever completions accumulated go out in one
``complete_many`` (a lone job is flushed at once; under load the batch grows while the previous call is in
flight). The other outcomes are one shielded pooled call each (a shutdown must not cut them). Once an end has committed,
the claimers of a capped queue claim again at once (``QueueState.ended``): the end made room under the cap.
"""

from __future__ import annotations

import logging
import math
from datetime import datetime
from typing import Any, LiteralString, TypeVar

import anyio
import psycopg

from pgjobs.client._call import Call
from pgjobs.client.lifecycle import (
    COMPLETE_MANY_RESULTS_SQL,
    COMPLETE_MANY_SQL,
    ack_cancel_call,
    fail_call,
    release_call,
)
from pgjobs.client.listen import backoff_delay
from pgjobs.client.pooler import PREPARED_LOST
from pgjobs.errors import translate
from pgjobs.records import JobState
from pgjobs.runtime.state import (
    CLAIM_OPTIONS,
    RECONNECT_CAP,
    SESSION_OPTIONS,
    TRANSIENT_ERRORS,
    Done,
    HeldJob,
    WorkerState,
)

log = logging.getLogger("pgjobs.worker")

T = TypeVar("T")


def _statement(batch: list[Done]) -> tuple[LiteralString, tuple[str, ...]]:
    """The complete_many call of ``batch``: ids, tokens (and results, when any job returned one) as literals."""
    ids = "{" + ",".join([str(b[0]) for b in batch]) + "}"
    tokens = "{" + ",".join([b[1] for b in batch]) + "}"
    results = [b[2] for b in batch]
    if any(r is not None for r in results):
        return COMPLETE_MANY_RESULTS_SQL, (ids, tokens, "[" + ",".join([r or "null" for r in results]) + "]")
    return COMPLETE_MANY_SQL, (ids, tokens)


class Completer:
    """The completer task of one worker run (``await Completer(w).run()``)."""

    def __init__(self, w: WorkerState) -> None:
        self.w = w
        self.conn: psycopg.AsyncConnection[Any] | None = None
        self.cur: psycopg.AsyncCursor[Any] | None = None
        self.failures = 0

    async def run(self) -> None:
        w = self.w
        try:
            while True:
                if not w.done:
                    if w.stopping and not w.jobs:
                        return
                    w.completer_wait = anyio.Event()
                    with anyio.move_on_after(0.5 if w.stopping else math.inf):
                        await w.completer_wait.wait()
                    w.completer_wait = None
                    continue
                batch, w.done = w.done, []
                w.in_flight = batch
                await self._send(batch)
                w.in_flight = []
        finally:
            if self.conn is not None:
                with anyio.CancelScope(shield=True):
                    await self.conn.close()

    async def _send(self, batch: list[Done]) -> None:
        """One complete_many for ``batch``, retried through connection errors (a stopping worker gives up)."""
        w = self.w
        query, params = _statement(batch)
        raced = 0
        while True:
            try:
                if self.conn is None or self.conn.closed or self.cur is None:
                    options = SESSION_OPTIONS if w.durable_completions else CLAIM_OPTIONS
                    self.conn = await w.connect("complete", options)
                    self.cur = self.conn.cursor()
                cur = self.cur
                with anyio.CancelScope(shield=True):
                    if w.tracer is not None:
                        row = await self._traced(batch, query, params)
                    else:
                        await cur.execute(query, params, prepare=w.prepare)
                        row = await cur.fetchone()
                done = int(row[0]) if row else 0
                w.complete_calls += 1
                if w.metrics is not None:
                    w.metrics.completion_batches.inc()
                if w.outage.down:
                    w.outage.restored("complete_many")
                w.completed += done
                if done < len(batch):
                    w.lost += len(batch) - done
                self.failures = 0
                _ended(batch)
                return
            except TRANSIENT_ERRORS as exc:
                # A lost race (40001/40P01, see state.TRANSIENT_SQLSTATES): the statement changed nothing and
                # the same batch goes again on the same connection (a job that ended meanwhile is a no-op of
                # the compare-and-set). Taken for an outage, it closed the connection, and a stopping worker
                # gave up on the batch after five: jobs that had run were left to run again.
                raced += 1
                await w.lost_race(f"complete_many of {len(batch)} job(s)", exc, raced, give_up=False)
            except PREPARED_LOST as exc:
                w.unprepare(exc)  # a pooler lost the prepared statement: it did not run; the batch goes again
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                self.failures += 1
                w.cut_off_at = anyio.current_time()
                delay = backoff_delay(self.failures, 0.05, RECONNECT_CAP)
                w.outage.lost(f"complete_many of {len(batch)} job(s)", exc, delay)
                if self.conn is not None:
                    await self.conn.close()
                    self.conn = None
                if w.stopping and self.failures >= 5:
                    # A stopping worker does not wait forever for the database: these jobs stay leased
                    # and run again elsewhere once their leases expire (at least once, not lost).
                    log.error("giving up on completing %d job(s) while stopping: %s", len(batch), exc)
                    return
                await w.backoff(delay)
            except psycopg.Error as exc:
                raise translate(exc) from exc

    async def _traced(self, batch: list[Done], query: LiteralString, params: tuple[str, ...]) -> Any:
        """The complete_many call in a settle span linked to the attempt span of every job it completes."""
        w = self.w
        assert w.tracer is not None and self.cur is not None
        held = [w.spans.get(b[0]) for b in batch]
        queues = {h[1] for h in held if h is not None}
        with w.tracer.settle_batch(queues.pop() if len(queues) == 1 else None, [h[0] for h in held if h]):
            await self.cur.execute(query, params, prepare=w.prepare)
            row = await self.cur.fetchone()
        for b in batch:
            w.spans.pop(b[0], None)
        return row


def _ended(batch: list[Done]) -> None:
    """Their ends committed: the claimers of capped queues among them claim again now (QueueState.ended)."""
    last = None
    for b in batch:
        q = b[3]
        if q is not last and q.capped:
            q.ended()
        last = q


async def _report(w: WorkerState, job: HeldJob, call: Call[T], op: str) -> T | None:
    """A job's final call: shielded (a shutdown must not cut it), errors logged, never raised; in a settle span
    when tracing is on."""
    with anyio.CancelScope(shield=True):
        try:
            if job.span is not None and w.tracer is not None:
                with w.tracer.settle(job.span, job.queue.name, job.id, op):
                    return await w.call(call)
            return await w.call(call)
        except Exception as exc:
            log.error("job %s (%s): reporting its outcome failed: %s", job.id, job.kind, exc)
            return None
    return None  # (not reached: the shielded scope is never cancelled itself)


async def fail(w: WorkerState, job: HeldJob, error: str, retry_at: datetime | None) -> JobState | None:
    """``fail``: the job's state after it (None: the lease was gone or the report failed)."""
    state = await _report(w, job, fail_call(job.id, job.token, error, retry_at), "fail")
    w.failed += 1
    job.queue.ended()
    if state == JobState.SCHEDULED:
        w.poke_poller()
    return state


async def release(w: WorkerState, job: HeldJob, run_at: datetime | None) -> None:
    ok = await _report(w, job, release_call(job.id, job.token, run_at), "release")
    if ok:
        w.released += 1
    job.queue.ended()
    if run_at is not None:
        w.poke_poller()


async def ack_cancel(w: WorkerState, job: HeldJob) -> None:
    ok = await _report(w, job, ack_cancel_call(job.id, job.token), "ack_cancel")
    if ok:
        w.cancelled += 1
    job.queue.ended()

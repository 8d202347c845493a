"""Running jobs: per queue, ``capacity`` long-lived **slot** tasks that run the claimed jobs (no task spawn per
job), and the mapping of how a handler ended to the job's outcome.

Outcomes: return -> ``complete`` (batched); ``Retry`` -> ``fail(retry_at)``; ``Snooze`` -> ``release(run_at)``;
``Parked`` (a durable sleep or wait, pgjobs/runtime/durable.py) -> nothing more, its SQL call gave the job back;
other exception -> ``fail(traceback)`` (``retry_at`` from the handler's ``retry`` policy, else the SQL backoff);
timeout -> ``fail("TimeoutError: ...")``; cancellation requested -> ``ack_cancel`` however the handler ended;
lease lost -> nothing (the token no longer holds the job); shutdown after the grace period -> ``release``.

A slot frees when the handler returns (its completion may still be in the completer's next batch).
"""

from __future__ import annotations

import inspect
import json
import logging
from functools import partial
from typing import Any

import anyio

from pgjobs.runtime import telemetry
from pgjobs.runtime.app import Retry, Snooze, when_to_datetime
from pgjobs.runtime.completer import ack_cancel, fail, release
from pgjobs.runtime.context import CancelFlag, JobContext, JobRuntime, SyncJobContext
from pgjobs.runtime.durable import Parked
from pgjobs.runtime.errortext import handler_traceback
from pgjobs.runtime.state import FINISHING, RUNNING, HeldJob, QueueState, WorkerState

log = logging.getLogger("pgjobs.worker")


async def slot(w: WorkerState, q: QueueState) -> None:
    ready = q.ready
    parked = q.parked
    while True:
        if ready:
            job = ready.popleft()
            if ready and parked:
                parked.pop().set()
            try:
                reason = job.stop_reason
                if reason in ("shutdown", "lease lost", "cancel requested"):  # ended before it started
                    await _skip(w, job)
                else:
                    await _execute(w, job)
            finally:
                _ended(w, job)
            continue
        if w.stopping and not q.running > 0:
            return
        ev = anyio.Event()
        parked.append(ev)
        await ev.wait()
        if w.stopping and not ready and not q.running > 0:
            return


def _context(runtime: JobRuntime, job: HeldJob, flag: CancelFlag) -> JobContext | SyncJobContext:
    checkpoint = None if job.checkpoint is None else json.loads(job.checkpoint)
    ctx_cls = JobContext if job.handler.is_async else SyncJobContext
    ctx = ctx_cls(runtime, job.id, job.kind, job.queue.name, job.attempt, job.max_attempts, job.token, checkpoint,
                  job.batch_id, job.meta, flag)  # fmt: skip
    if job.parents is not None:
        ctx.parent_results = {int(k): v for k, v in json.loads(job.parents).items()}
    return ctx


async def _skip(w: WorkerState, job: HeldJob) -> None:
    """A job that ends before it starts: released at shutdown, cancelled when its cancellation was confirmed
    first (the handler never runs), or dropped when claimed again meanwhile."""
    job.phase = FINISHING
    if job.stop_reason == "shutdown":  # claimed but not started before the worker stopped
        await release(w, job, None)
        telemetry.job_ended(w, job, "released")
    elif job.stop_reason == "cancel requested":
        await ack_cancel(w, job)
        telemetry.job_ended(w, job, "cancelled")
    else:  # "lease lost": claimed again before it started (see claimer.dispatch)
        w.lost += 1
        job.queue.ended()
        telemetry.job_ended(w, job, "lost")


def _ended(w: WorkerState, job: HeldJob) -> None:
    """The job left its slot, however it ended: the slot is free."""
    q = job.queue
    # Only this attempt's entry: after a re-claim of the same job (see dispatch) the entry is the new one's.
    if w.jobs.get(job.id) is job:
        del w.jobs[job.id]
    q.running -= 1
    q.poke("slot")
    if w.stopping and q.running == 0:
        for ev in q.parked:  # the last job of a stopping worker: parked slots may exit now
            ev.set()
        q.parked.clear()


async def _execute(w: WorkerState, job: HeldJob) -> None:
    """Runs the handler under its cancel scope and timeout, then reports the outcome."""
    handler = job.handler
    payload = json.loads(job.payload)
    flag = CancelFlag(threaded=not handler.is_async)
    ctx = job.ctx = _context(w, job, flag)  # the worker is the context's JobRuntime
    error: BaseException | None = None
    parked: Parked | None = None
    result: Any = None
    timeout = handler.timeout
    scope = anyio.CancelScope()
    job.scope = scope
    job.phase = RUNNING
    telemetry.job_started(w, job)
    # The timeout is a loop timer, not a scope deadline, so ctx.cancelled says "timeout" before the
    # handler sees the cancellation (and a sync handler in its thread can notice it).
    timer = None if timeout is None else w.call_later(timeout, job.interrupt, "timeout")
    try:
        with scope, telemetry.current_span(w, job):
            if handler.is_async:
                result = handler.func(payload, ctx)
                if inspect.isawaitable(result):  # (a wrapper of an async def may be a plain def)
                    result = await result
            else:
                assert w.limiter is not None
                result = await anyio.to_thread.run_sync(
                    partial(handler.func, payload, ctx), abandon_on_cancel=True, limiter=w.limiter
                )
    except Parked as exc:  # a durable sleep or wait gave the job back (sql/durable.sql)
        parked = exc
    except Exception as exc:
        error = exc
    finally:
        if timer is not None:
            timer.cancel()
    job.phase = FINISHING
    outcome: str
    why: BaseException | str | None = error
    if parked is not None:
        outcome = _parked(w, parked.outcome)
    elif scope.cancelled_caught or (scope.cancel_called and error is not None):
        outcome, why = await _interrupted(w, job, job.stop_reason or "timeout")
    elif flag.is_set() and flag.reason == "cancel requested":
        await ack_cancel(w, job)
        outcome = "cancelled"
    elif error is None:
        try:
            encoded = None if result is None else json.dumps(result)
        except (TypeError, ValueError) as exc:
            why = TypeError(f"the handler's result is not JSON-serializable: {exc}")
            outcome = await _failed(w, job, why)
        else:
            w.done.append((job.id, job.token, encoded, job.queue))
            w.poke_completer()
            outcome = "succeeded"
    else:
        outcome = await _failed(w, job, error)
    telemetry.job_ended(w, job, outcome, why)


def _parked(w: WorkerState, outcome: str) -> str:
    """A handler stopped by a durable sleep or wait: the SQL call already ended the attempt."""
    if outcome == "parked":
        w.released += 1  # (a park is a release that keeps the job's place in its handler)
        w.poke_poller()  # its resume time may be the next due run_at
        return "parked"
    if outcome == "cancelled":
        w.cancelled += 1
        return "cancelled"
    w.lost += 1
    return "lost"


async def _interrupted(w: WorkerState, job: HeldJob, reason: str) -> tuple[str, str | None]:
    """Reports an attempt the worker cut short; returns its outcome and why."""
    if reason == "lease lost":
        w.lost += 1
        job.queue.ended()
        return "lost", "lease lost (reclaimed elsewhere); its outcome is dropped"
    if reason == "shutdown":
        await release(w, job, None)
        return "released", "worker stopping"
    if reason == "cancel requested":
        await ack_cancel(w, job)
        return "cancelled", None
    text = f"TimeoutError: the job ran longer than its timeout of {job.handler.timeout:g} s"
    return telemetry.fail_outcome(await fail(w, job, text, None)), text


async def _failed(w: WorkerState, job: HeldJob, error: BaseException) -> str:
    """Reports a handler that raised; returns the outcome."""
    if isinstance(error, Retry):
        retry_at = None if error.after is None else when_to_datetime(error.after)
        return telemetry.fail_outcome(await fail(w, job, str(error), retry_at))
    if isinstance(error, Snooze):
        await release(w, job, when_to_datetime(error.until))
        return "snoozed"
    if job.ctx is not None and job.ctx.cancelled.is_set() and job.ctx.cancelled.reason == "cancel requested":
        await ack_cancel(w, job)
        return "cancelled"
    text = handler_traceback(error)
    return telemetry.fail_outcome(await fail(w, job, text, job.handler.retry_at(job.attempt)))

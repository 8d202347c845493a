"""Where the worker's parts report to metrics, traces and logs: one call at each point of a job's life and of
the worker's own (start, stop requested, stopped).

Each hook costs, with metrics and tracing off and logging at its default level, a ``perf_counter()`` and a
few ``is None`` / ``isEnabledFor`` tests: the bench's no-op jobs do not see it (README "Operations").
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import logging
import time
from typing import Any

from pgjobs.records import JobState
from pgjobs.runtime import tracing
from pgjobs.runtime.metrics import WorkerMetrics
from pgjobs.runtime.state import HeldJob, WorkerState

log = logging.getLogger("pgjobs.worker")

_INFO_OUTCOMES = frozenset({"succeeded", "cancelled", "snoozed", "released", "parked"})


def _version() -> str:
    try:
        return importlib.metadata.version("pgjobs-queue")  # the distribution name (import pgjobs)
    except importlib.metadata.PackageNotFoundError:
        return ""


def start(w: WorkerState) -> None:
    """Before the worker connects: the tracer, the metrics endpoint (fails the start if its port is taken)."""
    if tracing.enabled(w.tracing):
        w.tracer = tracing.Tracer(w.name)
    port = w.metrics_port
    if port is not None:
        m = WorkerMetrics(w.name, _version())
        for q in w.queue_states:
            m.watch_queue(q.name, q.capacity, lambda q=q: float(q.running))  # type: ignore[misc]
        m.watch_connection(
            lambda: 1.0 if w.listener is not None and w.listener.connected else 0.0,
            lambda: 0.0 if w.outage.down else 1.0,
        )
        bound = m.serve(port, w.metrics_host)
        w.metrics = m
        log.info("metrics on http://%s:%d/metrics", w.metrics_host, bound, extra={"event": "worker.metrics"})
    if not w.prepare and w.listen_dsn is None:
        log.warning(
            "prepare=False without listen_dsn: LISTEN goes to the same DSN, and through PgBouncer in transaction "
            "mode its notifications are lost (the worker then only polls); pass listen_dsn / --listen-dsn"
        )
    queues = ", ".join(f"{q}={n}" for q, n in w.queues.items())
    log.info("worker %s starting: queues %s", w.name, queues, extra={"event": "worker.start", "worker": w.name})


def close(w: WorkerState) -> None:
    if w.metrics is not None:
        w.metrics.close()


def stop_requested(w: WorkerState) -> None:
    running = len(w.jobs)
    grace = w.grace_period
    hard = w.hard_stop
    log.info(
        "stop requested: no more claims; %d job(s) %s",
        running, "released now" if hard else f"finishing (up to {grace:g} s, then released)",
        extra={"event": "worker.stopping", "worker": w.name, "jobs": running},
    )  # fmt: skip


def stopped(w: WorkerState, ran_for: float) -> None:
    log.info(
        "stopped after %.1f s: claimed %d, completed %d, failed %d, released %d, cancelled %d, lost %d",
        ran_for, w.claimed, w.completed, w.failed, w.released, w.cancelled, w.lost,
        extra={"event": "worker.stopped", "worker": w.name, "duration_s": round(ran_for, 3)},
    )  # fmt: skip


# ------------------------------------------------------------------------------------------ per job


def job_started(w: WorkerState, job: HeldJob) -> None:
    job.started = time.perf_counter()
    tracer = w.tracer
    if tracer is not None:
        job.span = tracer.process(job.id, job.kind, job.queue.name, job.attempt, job.meta)
    if log.isEnabledFor(logging.DEBUG):
        log.debug(
            "job %s (%s) attempt %s started", job.id, job.kind, job.attempt,
            extra={"event": "job.start", "job_id": job.id, "kind": job.kind, "queue": job.queue.name,
                   "attempt": job.attempt},
        )  # fmt: skip


_NO_SPAN = contextlib.nullcontext()


def current_span(w: WorkerState, job: HeldJob) -> contextlib.AbstractContextManager[Any]:
    """Around the handler: its attempt's span as the current one (a reusable no-op without tracing)."""
    if job.span is None or w.tracer is None:
        return _NO_SPAN
    cm: contextlib.AbstractContextManager[Any] = w.tracer.current(job.span)
    return cm


def fail_outcome(state: JobState | None) -> str:
    """What a ``fail`` call's answer means: another attempt later, failed for good, or the lease was gone."""
    if state is None:
        return "lost"
    return "failed" if state == JobState.FAILED else "retried"


def job_ended(w: WorkerState, job: HeldJob, outcome: str, error: BaseException | str | None = None) -> None:
    """The attempt is over (its outcome reported, or queued for ``complete_many``)."""
    duration = None if job.started is None else time.perf_counter() - job.started
    queue = job.queue.name
    m = w.metrics
    if m is not None:
        m.ended(queue, job.kind, outcome, duration)
    span = job.span
    if span is not None and w.tracer is not None:
        w.tracer.end_process(span, outcome, error if isinstance(error, BaseException) else None)
        if outcome == "succeeded":
            w.spans[job.id] = (span, queue)  # the complete_many span links it
    level = logging.INFO if outcome in _INFO_OUTCOMES else logging.WARNING
    if log.isEnabledFor(level):
        _log_end(job, outcome, duration, error, level)


def _log_end(job: HeldJob, outcome: str, duration: float | None, error: BaseException | str | None, level: int) -> None:
    took = "" if duration is None else f" in {duration:.3f} s"
    why = ""
    if error is not None:
        text = f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else error
        why = ": " + (text.strip().splitlines() or [""])[0][:300]  # the first line: a traceback is in the job
    fields: dict[str, Any] = {
        "event": "job.end", "job_id": job.id, "kind": job.kind, "queue": job.queue.name, "attempt": job.attempt,
        "outcome": outcome, "duration_s": None if duration is None else round(duration, 6),
    }  # fmt: skip
    if why:
        fields["error"] = why[2:]
    log.log(level, "job %s (%s) attempt %s %s%s%s", job.id, job.kind, job.attempt, outcome, took, why, extra=fields)

"""``pgjobs.testing``: test your handlers and your enqueues against a real PostgreSQL, no worker needed.

* :func:`perform_job` / :func:`aperform_job` run one job through its handler with a real context: the job
  is enqueued, claimed (so ``ctx.save_checkpoint``, ``report_progress`` and ``add_to_batch`` are the real
  lease-guarded calls) and ended the way a worker would end it (complete, fail, release). Given ``conn``,
  everything happens inside the caller's transaction, and rolls back with it.
* :func:`assert_enqueued` / :func:`refute_enqueued`: is there a job of this kind / queue / payload subset
  that has not run yet (``waiting``, ``scheduled`` or ``pending``)? On ``conn`` they see the caller's own
  uncommitted jobs.
* :class:`~pgjobs.ops.scratch.Recorder` (as :func:`notifications`): a LISTENing connection, for asserting
  what was (not) notified: a rolled-back transaction never notifies.
* :mod:`pgjobs.testing.plugin`: pytest fixtures for a migrated throwaway database per test (enable it with
  ``-p pgjobs.testing.plugin`` or ``pytest_plugins = ["pgjobs.testing.plugin"]`` in your conftest).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar
from uuid import UUID

import anyio
import psycopg

from pgjobs.client._call import AsyncConn, Call, SyncConn
from pgjobs.client.arguments import NO_PAYLOAD
from pgjobs.client.claim import AsyncClaimOps, ClaimOps
from pgjobs.client.enqueue import AsyncEnqueueOps, EnqueueOps
from pgjobs.client.graph import AsyncGraphOps, GraphOps
from pgjobs.client.lifecycle import AsyncLifecycleOps, LifecycleOps
from pgjobs.client.status import AsyncStatusOps, StatusOps
from pgjobs.ops.scratch import Recorder
from pgjobs.records import ClaimedJob, Job, JobState, JobStatus
from pgjobs.runtime.app import (
    App,
    CancelFlag,
    JobContext,
    JobHandler,
    Retry,
    Snooze,
    SyncJobContext,
    when_to_datetime,
)
from pgjobs.runtime.durable import Parked
from pgjobs.runtime.errortext import handler_traceback

__all__ = ["Performed", "aperform_job", "assert_enqueued", "notifications", "perform_job", "refute_enqueued"]

T = TypeVar("T")
WORKER = "pgjobs-testing"
NOT_RUN = (JobState.WAITING, JobState.SCHEDULED, JobState.PENDING)
# claimed before anything else of its queue: the job perform_job just enqueued, not an older one
_FIRST = -32768


def notifications(dsn: str, *channels: str) -> Recorder:
    """``with notifications(dsn, "pgjobs_wake") as heard: ...; assert heard.collect(0.2) == []``."""
    return Recorder(dsn, list(channels) or ["pgjobs_wake", "pgjobs_status", "pgjobs_cancel"])


@dataclass(frozen=True, slots=True)
class Performed:
    """What :func:`perform_job` did: the job's id, its state afterwards, what the handler returned (or
    raised), and the job's full status row afterwards."""

    id: int
    state: JobState
    result: Any
    exception: BaseException | None
    job: JobStatus

    def raise_for_error(self) -> Performed:
        """Re-raises the handler's exception, if it raised one; else returns ``self``."""
        if self.exception is not None:
            raise self.exception
        return self


class _Sync(EnqueueOps, ClaimOps, LifecycleOps, StatusOps, GraphOps):
    """The client calls, always on one given connection (no pool)."""


class _Async(AsyncEnqueueOps, AsyncClaimOps, AsyncLifecycleOps, AsyncStatusOps, AsyncGraphOps):
    pass


class _Host:
    """The :class:`~pgjobs.runtime.context.JobRuntime` of a performed job (the worker's role): the
    lease-guarded calls, on the caller's connection."""

    def __init__(self, calls: Any, conn: Any, is_async: bool) -> None:
        self._calls = calls
        self._conn = conn
        self._is_async = is_async

    @property
    def name(self) -> str:
        return WORKER

    async def checkpoint(self, id: int, lease_token: str, value: Any) -> bool:
        return bool(await self._do(self._calls.checkpoint, id, UUID(lease_token), value))

    async def progress(self, id: int, lease_token: str, value: Any) -> bool:
        return bool(await self._do(self._calls.progress, id, UUID(lease_token), value))

    async def add_to_batch(
        self, id: int, lease_token: str, spec: Mapping[str, Any], before_continuations: bool
    ) -> int | None:
        added = await self._do(
            self._calls.add_to_batch, id, UUID(lease_token), spec, before_continuations=before_continuations
        )
        return None if added is None else int(added)

    async def run_call(self, call: Call[T]) -> T:
        out = self._calls._run(call, self._conn)
        return await out if self._is_async else out  # type: ignore[no-any-return]

    async def _do(self, method: Any, *args: Any, **kwargs: Any) -> Any:
        out = method(*args, conn=self._conn, **kwargs)
        return await out if self._is_async else out


def _handler(app: App, kind: str) -> JobHandler:
    handler = app.handler(kind)
    if handler is None:
        raise LookupError(f"app has no handler for kind {kind!r} (it declares {', '.join(app.kinds) or 'none'})")
    return handler


async def _perform(
    host: _Host, handler: JobHandler, job: ClaimedJob, checkpoint: Any, parents: Mapping[int, Any] | None
) -> tuple[Any, BaseException | None]:
    flag = CancelFlag(threaded=not handler.is_async)
    ctx_cls = JobContext if handler.is_async else SyncJobContext
    start = job.checkpoint if checkpoint is None else checkpoint
    ctx = ctx_cls(
        host,
        job.id,
        job.kind,
        job.queue,
        job.attempt,
        job.max_attempts,
        str(job.lease_token),
        start,
        job.batch_id,
        job.meta,
        flag,
    )
    if parents is not None:
        ctx.parent_results = dict(parents)
    elif handler.parent_results:
        ctx.parent_results = await host._do(host._calls.parent_results, job.id) or {}
    payload = job.payload
    try:
        with anyio.fail_after(handler.timeout):
            if handler.is_async:
                return await handler.func(payload, ctx), None
            return await anyio.to_thread.run_sync(handler.func, payload, ctx), None
    except (Exception, Parked) as exc:  # Parked: a durable sleep or wait gave the job back
        return None, exc


async def _end(host: _Host, handler: JobHandler, job: ClaimedJob, result: Any, exc: BaseException | None) -> None:
    """Ends the attempt as the worker would: complete, Retry -> fail(retry_at), Snooze -> release, else fail."""
    calls, token = host._calls, job.lease_token
    if exc is None:
        await host._do(calls.complete, job.id, token, result)
    elif isinstance(exc, Parked):
        return  # its SQL call ended the attempt
    elif isinstance(exc, Snooze):
        await host._do(calls.release, job.id, token, when_to_datetime(exc.until))
    elif isinstance(exc, Retry):
        retry_at = when_to_datetime(exc.after) if exc.after is not None else handler.retry_at(job.attempt)
        await host._do(calls.fail, job.id, token, str(exc), retry_at)
    else:
        text = handler_traceback(exc)
        await host._do(calls.fail, job.id, token, text, handler.retry_at(job.attempt))


def _claimed(claimed: list[ClaimedJob], id: int) -> ClaimedJob:
    if not claimed or claimed[0].id != id:
        got = claimed[0].id if claimed else None
        raise RuntimeError(
            f"perform_job could not claim job {id} (claimed {got}): is its queue paused, capped or fair?"
        )
    return claimed[0]


def perform_job(
    app: App,
    kind: str,
    payload: Any = NO_PAYLOAD,
    *,
    conn: SyncConn | None = None,
    dsn: str | None = None,
    checkpoint: Any = None,
    parent_results: Mapping[int, Any] | None = None,
    **enqueue_options: Any,
) -> Performed:
    """Runs one ``kind`` job with ``payload`` through ``app``'s handler, with a real context, and ends it as
    a worker would. On ``conn`` (your connection, in your transaction) or on a new connection to ``dsn``.

    ``checkpoint`` pretends an earlier attempt saved it (``ctx.checkpoint``); ``parent_results`` fills
    ``ctx.parent_results``; other keywords go to ``enqueue`` (``queue``, ``meta``, ``max_attempts`` ...; the
    handler's declared ones apply otherwise). Call it from synchronous code; async tests use
    :func:`aperform_job`."""
    if conn is None:
        if dsn is None:
            raise ValueError("perform_job needs conn= (your connection) or dsn=")
        with psycopg.connect(dsn, autocommit=True) as own:
            return perform_job(
                app, kind, payload, conn=own, checkpoint=checkpoint, parent_results=parent_results, **enqueue_options
            )
    handler = _handler(app, kind)
    calls = _Sync()
    calls._enqueue_defaults = app
    options = {"priority": _FIRST, **enqueue_options}
    job_id = calls.enqueue(kind, payload, conn=conn, **options).id
    queue = calls.job_status(job_id, conn=conn).queue  # type: ignore[union-attr]
    job = _claimed(calls.claim(WORKER, [queue], 1, 300.0, {kind: 1}, conn=conn), job_id)
    host = _Host(calls, conn, is_async=False)

    async def run() -> tuple[Any, BaseException | None]:
        out = await _perform(host, handler, job, checkpoint, parent_results)
        await _end(host, handler, job, *out)
        return out

    result, exc = anyio.run(run)
    status = calls.job_status(job_id, conn=conn)
    assert status is not None
    return Performed(job_id, status.state, result, exc, status)


async def aperform_job(
    app: App,
    kind: str,
    payload: Any = NO_PAYLOAD,
    *,
    conn: AsyncConn | None = None,
    dsn: str | None = None,
    checkpoint: Any = None,
    parent_results: Mapping[int, Any] | None = None,
    **enqueue_options: Any,
) -> Performed:
    """:func:`perform_job` for async tests, on an ``psycopg.AsyncConnection`` (or a new one to ``dsn``)."""
    if conn is None:
        if dsn is None:
            raise ValueError("aperform_job needs conn= (your connection) or dsn=")
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as own:
            return await aperform_job(
                app, kind, payload, conn=own, checkpoint=checkpoint, parent_results=parent_results, **enqueue_options
            )
    handler = _handler(app, kind)
    calls = _Async()
    calls._enqueue_defaults = app
    options = {"priority": _FIRST, **enqueue_options}
    job_id = (await calls.enqueue(kind, payload, conn=conn, **options)).id
    queue = (await calls.job_status(job_id, conn=conn)).queue  # type: ignore[union-attr]
    job = _claimed(await calls.claim(WORKER, [queue], 1, 300.0, {kind: 1}, conn=conn), job_id)
    host = _Host(calls, conn, is_async=True)
    result, exc = await _perform(host, handler, job, checkpoint, parent_results)
    await _end(host, handler, job, result, exc)
    status = await calls.job_status(job_id, conn=conn)
    assert status is not None
    return Performed(job_id, status.state, result, exc, status)


def _subset(part: Any, whole: Any) -> bool:
    """Is ``part`` contained in ``whole`` (dict keys recursively; lists and scalars compare equal)?"""
    if isinstance(part, Mapping):
        return isinstance(whole, Mapping) and all(k in whole and _subset(v, whole[k]) for k, v in part.items())
    return bool(part == whole)


def enqueued(
    conn: SyncConn,
    kind: str | None = None,
    *,
    queue: str | None = None,
    payload: Mapping[str, Any] | None = None,
    states: tuple[JobState, ...] = NOT_RUN,
) -> list[Job]:
    """The jobs on ``conn`` (newest first) of ``kind``/``queue`` whose payload contains ``payload`` and whose
    state is one of ``states`` (by default: not run yet)."""
    calls = _Sync()
    found: list[Job] = []
    for state in states:
        found += calls.list_jobs(state, queue, kind, None, 100_000, 0, conn=conn)
    found.sort(key=lambda j: (j.created_at, j.id), reverse=True)
    return [j for j in found if payload is None or _subset(payload, j.payload)]


def _describe(kind: str | None, queue: str | None, payload: Any) -> str:
    parts = [
        f"kind={kind!r}" if kind else "",
        f"queue={queue!r}" if queue else "",
        f"payload⊇{payload!r}" if payload else "",
    ]
    return ", ".join(p for p in parts if p) or "any job"


def assert_enqueued(
    conn: SyncConn,
    kind: str | None = None,
    *,
    queue: str | None = None,
    payload: Mapping[str, Any] | None = None,
    count: int | None = None,
    states: tuple[JobState, ...] = NOT_RUN,
) -> list[Job]:
    """Fails (AssertionError) unless a job matching ``kind``/``queue``/``payload`` subset waits to run
    (exactly ``count`` of them if given); returns the matching jobs."""
    found = enqueued(conn, kind, queue=queue, payload=payload, states=states)
    if (count is None and not found) or (count is not None and len(found) != count):
        want = "a job" if count is None else f"{count} job(s)"
        seen = [(j.kind, j.queue, j.payload) for j in enqueued(conn, states=states)[:10]]
        raise AssertionError(
            f"expected {want} with {_describe(kind, queue, payload)}, found {len(found)}; jobs not run yet: {seen}"
        )
    return found


def refute_enqueued(
    conn: SyncConn,
    kind: str | None = None,
    *,
    queue: str | None = None,
    payload: Mapping[str, Any] | None = None,
    states: tuple[JobState, ...] = NOT_RUN,
) -> None:
    """Fails (AssertionError) if a job matching ``kind``/``queue``/``payload`` subset waits to run."""
    found = enqueued(conn, kind, queue=queue, payload=payload, states=states)
    if found:
        raise AssertionError(
            f"expected no job with {_describe(kind, queue, payload)}, found {len(found)}: "
            f"{[(j.id, j.kind, j.queue, j.payload) for j in found[:10]]}"
        )

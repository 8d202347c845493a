"""What a handler gets: its :class:`JobContext` (async) or :class:`SyncJobContext` (sync), and the
:class:`CancelFlag` that tells it to stop.

A context reaches the database only through a :class:`JobRuntime`, the small typed interface the worker
implements (``pgjobs.runtime.worker.Worker``): this module imports nothing of the worker.
"""

from __future__ import annotations

import inspect
import json
import threading
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any, Protocol, TypeVar

import anyio

from pgjobs.client._call import Call
from pgjobs.client.durable import (
    await_signal_call,
    job_steps_call,
    record_step_call,
    sleep_call,
    sleep_until_call,
)
from pgjobs.runtime import durable
from pgjobs.runtime.durable import WaitResult

T = TypeVar("T")


class JobRuntime(Protocol):
    """What a context needs from the runtime that runs its job. Every call is one lease-token
    compare-and-set on the event loop: False/None once the token no longer holds the job."""

    @property
    def name(self) -> str:
        """The worker's name (``ctx.worker_name``)."""
        ...

    async def checkpoint(self, id: int, lease_token: str, value: Any) -> bool:
        """``pgjobs.checkpoint``: keeps ``value`` for the next attempt."""
        ...

    async def progress(self, id: int, lease_token: str, value: Any) -> bool:
        """``pgjobs.progress``: stores ``value`` and pushes a status event."""
        ...

    async def add_to_batch(
        self, id: int, lease_token: str, spec: Mapping[str, Any], before_continuations: bool
    ) -> int | None:
        """``pgjobs.add_to_batch``: the new sibling's id, None when the lease no longer holds the job."""
        ...

    async def run_call(self, call: Call[T]) -> T:
        """One call of the durable-execution functions (``ctx.step``, ``sleep``, ``wait_for``)."""
        ...


class JobCancelled(Exception):
    """Raised by ``ctx.raise_if_cancelled()``. A handler that ends (however) after the job's cancellation
    was requested ends the job ``cancelled`` (``ack_cancel``)."""


class CancelFlag:
    """Set when the job's cancellation was requested (``pgjobs_cancel``, or seen at lease renewal), when its
    timeout fired, its lease was lost, or the worker is shutting down. ``is_set()`` works from any thread;
    ``await wait()`` from async handlers; ``wait_blocking(timeout)`` from sync handlers."""

    __slots__ = ("_async", "_set", "_thread", "reason")

    def __init__(self, *, threaded: bool = False) -> None:
        self._set = False
        self._async: anyio.Event | None = None
        # Created up front for sync handlers: creating it lazily from the handler's thread would race set().
        self._thread: threading.Event | None = threading.Event() if threaded else None
        self.reason: str | None = None

    def is_set(self) -> bool:
        return self._set

    def __bool__(self) -> bool:
        return self._set

    def set(self, reason: str = "cancel requested") -> None:
        """Called on the worker's event loop thread."""
        if self._set:
            return
        self._set = True
        self.reason = reason
        if self._async is not None:
            self._async.set()
        if self._thread is not None:
            self._thread.set()

    async def wait(self) -> None:
        if self._set:
            return
        if self._async is None:
            self._async = anyio.Event()
        await self._async.wait()

    def wait_blocking(self, timeout: float | None = None) -> bool:
        """For sync handlers (in their worker thread): block until set or ``timeout``; returns is_set()."""
        if self._thread is None:
            raise RuntimeError("wait_blocking() is for sync handlers; async handlers use `await ctx.cancelled.wait()`")
        return self._thread.wait(timeout)


class _ContextBase:
    """What every handler context carries (read-only by convention)."""

    __slots__ = (
        "_durable",
        "_meta",
        "_runtime",
        "attempt",
        "batch_id",
        "cancelled",
        "checkpoint",
        "id",
        "kind",
        "lease_token",
        "max_attempts",
        "parent_results",
        "queue",
        "worker_name",
    )

    def __init__(
        self,
        runtime: JobRuntime,
        id: int,
        kind: str,
        queue: str,
        attempt: int,
        max_attempts: int,
        lease_token: str,
        checkpoint: Any,
        batch_id: int | None,
        meta: dict[str, Any] | str,
        cancelled: CancelFlag,
    ) -> None:
        self._runtime = runtime
        self.worker_name: str = runtime.name
        self.id = id
        self.kind = kind
        self.queue = queue
        self.attempt = attempt
        self.max_attempts = max_attempts
        self.lease_token = lease_token
        self.checkpoint = checkpoint  # from the previous attempt (None on the first)
        self.batch_id = batch_id
        self._meta = meta  # the job's meta JSON, parsed on first read
        self.cancelled = cancelled
        # {parent job id: its result} for kinds registered with parent_results=True; None otherwise
        self.parent_results: dict[int, Any] | None = None
        self._durable = durable.DurableState()

    @property
    def meta(self) -> dict[str, Any]:
        """The job's ``meta`` (trace context, caller tags)."""
        if isinstance(self._meta, str):
            self._meta = json.loads(self._meta)
        assert isinstance(self._meta, dict)
        return self._meta

    @property
    def last_attempt(self) -> bool:
        return self.attempt >= self.max_attempts

    def raise_if_cancelled(self) -> None:
        """Raises :class:`JobCancelled` when the job's cancellation was requested."""
        if self.cancelled.is_set():
            raise JobCancelled(self.cancelled.reason or "cancel requested")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} id={self.id} kind={self.kind!r} queue={self.queue!r} attempt={self.attempt}>"


class JobContext(_ContextBase):
    """The context of an async handler. Every call is one SQL round trip guarded by the lease token: it
    returns False (changes nothing) once the job is no longer this attempt's."""

    __slots__ = ()

    async def save_checkpoint(self, value: Any) -> bool:
        """Stores ``value`` (JSON) for the next attempt: ``ctx.checkpoint`` there."""
        return await self._runtime.checkpoint(self.id, self.lease_token, value)

    async def report_progress(self, value: Any) -> bool:
        """Stores ``value`` (JSON) as the job's progress and pushes a status event to subscribers."""
        return await self._runtime.progress(self.id, self.lease_token, value)

    async def add_to_batch(self, spec: Mapping[str, Any], before_continuations: bool = False) -> int | None:
        """Adds a sibling job (an ``enqueue_many`` spec) to this job's batch; returns its id, or None when the
        job is no longer this attempt's (the lease token no longer holds it)."""
        return await self._runtime.add_to_batch(self.id, self.lease_token, dict(spec), before_continuations)

    async def step(self, name: str, fn: Callable[..., Any], /, *args: Any) -> Any:
        """Runs ``fn(*args)`` (sync or async) once per job: its JSON result is recorded under ``name``, and a later
        attempt gets the recorded result without running ``fn`` again. A step that raises is not recorded (the
        job's retry policy runs it again)."""
        st = self._durable
        st.use(self.id, name)
        if st.steps is None:
            st.steps = await self._runtime.run_call(job_steps_call(self.id, self.lease_token))
        if name in st.steps:
            return st.steps[name]
        result = fn(*args)
        if inspect.isawaitable(result):
            result = await result
        value = durable.as_json(name, result)
        durable.recorded(await self._runtime.run_call(record_step_call(self.id, self.lease_token, name, value)))
        st.steps[name] = value
        return value

    async def sleep(self, seconds: float | timedelta, *, name: str | None = None) -> None:
        """A durable sleep: the job gives back its slot, lease and attempt, and resumes here after ``seconds``."""
        call = sleep_call(self.id, self.lease_token, self._durable.sleep_name(name), seconds)
        durable.slept(await self._runtime.run_call(call))

    async def sleep_until(self, until: datetime, *, name: str | None = None) -> None:
        """A durable sleep until ``until`` (an aware datetime)."""
        call = sleep_until_call(self.id, self.lease_token, self._durable.sleep_name(name), until)
        durable.slept(await self._runtime.run_call(call))

    async def wait_for(
        self, key: str, timeout: float | timedelta | None = None, *, name: str | None = None
    ) -> WaitResult:
        """Parks the job (no slot, no lease) until ``signal(key, payload)``, then returns the payload; after
        ``timeout`` (None: never) returns ``timed_out=True``. A signal sent before the wait is not lost."""
        call = await_signal_call(self.id, self.lease_token, self._durable.wait_name(name), key, timeout)
        return durable.waited(key, await self._runtime.run_call(call))


class SyncJobContext(_ContextBase):
    """The context of a sync handler: the same calls as :class:`JobContext`, blocking, from the handler's
    worker thread."""

    __slots__ = ()

    def save_checkpoint(self, value: Any) -> bool:
        return anyio.from_thread.run(self._runtime.checkpoint, self.id, self.lease_token, value)

    def report_progress(self, value: Any) -> bool:
        return anyio.from_thread.run(self._runtime.progress, self.id, self.lease_token, value)

    def add_to_batch(self, spec: Mapping[str, Any], before_continuations: bool = False) -> int | None:
        return anyio.from_thread.run(
            self._runtime.add_to_batch, self.id, self.lease_token, dict(spec), before_continuations
        )

    def step(self, name: str, fn: Callable[..., Any], /, *args: Any) -> Any:
        """As :meth:`JobContext.step`; ``fn`` runs in the handler's thread."""
        st = self._durable
        st.use(self.id, name)
        if st.steps is None:
            st.steps = self._run(job_steps_call(self.id, self.lease_token))
        if name in st.steps:
            return st.steps[name]
        value = durable.as_json(name, fn(*args))
        durable.recorded(self._run(record_step_call(self.id, self.lease_token, name, value)))
        st.steps[name] = value
        return value

    def sleep(self, seconds: float | timedelta, *, name: str | None = None) -> None:
        durable.slept(self._run(sleep_call(self.id, self.lease_token, self._durable.sleep_name(name), seconds)))

    def sleep_until(self, until: datetime, *, name: str | None = None) -> None:
        durable.slept(self._run(sleep_until_call(self.id, self.lease_token, self._durable.sleep_name(name), until)))

    def wait_for(self, key: str, timeout: float | timedelta | None = None, *, name: str | None = None) -> WaitResult:
        call = await_signal_call(self.id, self.lease_token, self._durable.wait_name(name), key, timeout)
        return durable.waited(key, self._run(call))

    def _run(self, call: Call[T]) -> T:
        return anyio.from_thread.run(self._runtime.run_call, call)

"""Handlers: ``App`` (the registry a worker runs), ``JobContext`` (what a handler gets), ``Retry`` / ``Snooze``.

A handler is an ``async def`` or a plain ``def`` taking ``(payload, ctx)``. What it returns becomes the
job's result (``complete(result=...)``); what it raises decides the next run:

* ``raise Retry(after=5)``: ``fail(..., retry_at=now + 5 s)`` (spends the attempt; out of attempts -> failed);
* ``raise Snooze(until=...)``: ``release(..., run_at=...)``, the attempt is given back;
* anything else: ``fail(id, token, <traceback>)``, and the handler's ``retry`` policy or else the SQL backoff
  (exponential with jitter) decides when it runs again.

Async handlers get a :class:`JobContext` whose calls are coroutines (``await ctx.save_checkpoint(v)``).
Sync handlers run in worker threads and get a :class:`SyncJobContext`: the same attributes, the same method
names, called without ``await`` from that thread.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar
from uuid import UUID

from pgjobs.client.arguments import NO_PAYLOAD, payload_object
from pgjobs.client.defaults import RateKey, rate_key_of
from pgjobs.runtime.context import CancelFlag, JobCancelled, JobContext, JobRuntime, SyncJobContext

__all__ = [
    "App",
    "CancelFlag",
    "JobCancelled",
    "JobContext",
    "JobHandler",
    "JobRuntime",
    "Retry",
    "Snooze",
    "SyncJobContext",
    "when_to_datetime",
]

F = TypeVar("F", bound=Callable[..., Any])
When = float | int | timedelta | datetime
RetryPolicy = Callable[[int], "float | timedelta | datetime | None"] | Sequence[float]


def when_to_datetime(value: When, now: datetime | None = None) -> datetime:
    """Seconds from now, a timedelta from now, or an absolute datetime (naive means UTC)."""
    now = now or datetime.now(UTC)
    if isinstance(value, datetime):
        return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    if isinstance(value, timedelta):
        return now + value
    if isinstance(value, int | float):
        return now + timedelta(seconds=float(value))
    raise TypeError(f"expected seconds, a timedelta or a datetime, got {value!r}")


class Retry(Exception):
    """Raise from a handler to end this attempt and run the job again ``after`` (seconds, a timedelta or
    an absolute datetime; ``None`` lets the SQL backoff decide). It spends the attempt: on the last one the
    job ends ``failed``."""

    def __init__(self, after: When | None = None, reason: str | None = None) -> None:
        self.after = after
        self.reason = reason
        super().__init__(reason or (f"retry requested (after {after!r})" if after is not None else "retry requested"))


class Snooze(Exception):
    """Raise from a handler to give the job back unfinished until ``until`` (seconds, a timedelta or a
    datetime), without spending an attempt (``release(..., run_at)``)."""

    def __init__(self, until: When = 0) -> None:
        self.until = until
        super().__init__(f"snoozed until {until!r}")


@dataclass(frozen=True, slots=True)
class JobHandler:
    """One registered kind."""

    kind: str
    func: Callable[..., Any]
    queue: str = "default"
    timeout: float | None = None
    max_attempts: int | None = None
    retry: RetryPolicy | None = None
    is_async: bool = True
    parent_results: bool = False
    priority: int | None = None
    rate_key: RateKey = None

    def retry_at(self, attempt: int, now: datetime | None = None) -> datetime | None:
        """When the handler's own ``retry`` policy wants attempt ``attempt`` retried (None: the SQL backoff)."""
        if self.retry is None:
            return None
        if callable(self.retry):
            value = self.retry(attempt)
        else:
            delays = list(self.retry)
            if not delays:
                return None
            value = delays[min(attempt, len(delays)) - 1]
        return None if value is None else when_to_datetime(value, now)

    def enqueue_defaults(self) -> dict[str, Any]:
        """``queue``, ``priority``, ``max_attempts`` and ``rate_key`` as declared (``rate_key`` may be a function
        of the payload: :func:`pgjobs.client.defaults.rate_key_of` gives a job's key)."""
        out: dict[str, Any] = {"queue": self.queue}
        if self.priority is not None:
            out["priority"] = self.priority
        if self.max_attempts is not None:
            out["max_attempts"] = self.max_attempts
        if self.rate_key is not None:
            out["rate_key"] = self.rate_key
        return out

    def enqueue(self, client: Any, payload: Any = NO_PAYLOAD, **options: Any) -> Any:
        """``client.enqueue(kind, payload, **options)`` with this handler's declared defaults where
        ``options`` has none: ``app.handlers["send_email"].enqueue(client, {...})``. With an
        :class:`~pgjobs.AsyncClient` it returns the coroutine to await."""
        given = {k: v for k, v in options.items() if v is not None}
        declared = self.enqueue_defaults()
        if self.rate_key is not None:
            declared["rate_key"] = rate_key_of(self.rate_key, payload_object(payload))
        return client.enqueue(self.kind, payload, **{**declared, **given})


def _is_async(func: Callable[..., Any]) -> bool:
    target = func
    while hasattr(target, "__wrapped__"):
        if inspect.iscoroutinefunction(target):
            return True
        target = target.__wrapped__
    return inspect.iscoroutinefunction(target) or inspect.iscoroutinefunction(getattr(target, "__call__", None))  # noqa: B004


@dataclass
class App:
    """The registry of handlers (and code-defined periodic jobs) that a :class:`pgjobs.Worker` runs."""

    name: str = "pgjobs"
    handlers: dict[str, JobHandler] = field(default_factory=dict)
    periodic_specs: list[Any] = field(default_factory=list)

    def job(
        self,
        kind: str,
        *,
        queue: str = "default",
        timeout: float | timedelta | None = None,
        max_attempts: int | None = None,
        retry: RetryPolicy | None = None,
        parent_results: bool = False,
        priority: int | None = None,
        rate_key: RateKey = None,
    ) -> Callable[[F], F]:
        """Registers the decorated function as the handler of ``kind``.

        ``queue``, ``priority`` and ``max_attempts`` are the defaults for enqueueing this kind: a
        ``pgjobs.Client(dsn, app=app)`` applies them when an enqueue does not say otherwise, and
        ``pgjobs worker --app`` without ``--queues`` serves every declared queue. A worker runs the kind from
        any queue it serves. ``timeout`` (seconds) bounds one attempt: the handler
        is cancelled and the job fails with ``TimeoutError``. ``retry``: ``None`` (the SQL backoff), a list of
        delays in seconds by attempt (the last repeats), or ``f(attempt) -> seconds | timedelta | datetime``.
        ``parent_results=True``: the worker fills ``ctx.parent_results`` ({parent job id: result}, batch parents
        meaning every member) before the handler starts, one round trip per claim that took such jobs.
        ``rate_key``: the rate limit (``configure_rate_limit``) this kind's jobs draw their start tokens from, a
        string or ``f(payload) -> str | None`` (per customer, per API host ...); an enqueue's own ``rate_key`` wins.
        """
        if not kind:
            raise ValueError("kind must be a non-empty string")
        if not queue:
            raise ValueError("queue must be a non-empty string")
        if rate_key == "":
            raise ValueError("rate_key must be a non-empty string, a function of the payload, or None")
        if max_attempts is not None and max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        if priority is not None and not -32768 <= priority <= 32767:
            raise ValueError(f"priority must fit a smallint (-32768..32767), got {priority}")
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
        if seconds is not None and seconds <= 0:
            raise ValueError(f"timeout must be positive, got {timeout!r}")

        def register(func: F) -> F:
            if kind in self.handlers:
                raise ValueError(f"kind {kind!r} already has a handler: {self.handlers[kind].func!r}")
            self.handlers[kind] = JobHandler(
                kind=kind,
                func=func,
                queue=queue,
                timeout=None if seconds is None else float(seconds),
                max_attempts=max_attempts,
                retry=retry,
                is_async=_is_async(func),
                parent_results=parent_results,
                priority=priority,
                rate_key=rate_key,
            )
            return func

        return register

    def periodic(
        self,
        *,
        cron: str,
        name: str,
        timezone: str = "UTC",
        payload: Any = None,
        queue: str = "default",
        timeout: float | timedelta | None = None,
        max_attempts: int | None = None,
        retry: RetryPolicy | None = None,
        **options: Any,
    ) -> Callable[[F], F]:
        """Registers the decorated function as the handler of kind ``name`` and declares a code-defined
        schedule ``name`` that enqueues it on ``cron`` (in ``timezone``). The worker's scheduler syncs the
        declared schedules to the database. Extra ``options`` go to :class:`pgjobs.recurring.PeriodicSpec`."""
        from pgjobs.client.recurring import PeriodicSpec  # the recurring module owns the spec

        job_decorator = self.job(name, queue=queue, timeout=timeout, max_attempts=max_attempts, retry=retry)

        def register(func: F) -> F:
            spec_kwargs: dict[str, Any] = dict(
                name=name, cron=cron, timezone=timezone, payload=payload, queue=queue, kind=name, **options
            )
            if max_attempts is not None:
                spec_kwargs.setdefault("max_attempts", max_attempts)
            spec = PeriodicSpec(**spec_kwargs)
            job_decorator(func)
            self.periodic_specs.append(spec)
            return func

        return register

    @property
    def kinds(self) -> list[str]:
        return sorted(self.handlers)

    @property
    def queues(self) -> list[str]:
        """Every queue a handler (or periodic job) of this app is declared on, sorted."""
        return sorted(
            {h.queue for h in self.handlers.values()} | {getattr(s, "queue", "default") for s in self.periodic_specs}
        )

    def enqueue_defaults(self, kind: str) -> dict[str, Any]:
        """The declared ``queue``/``priority``/``max_attempts`` of ``kind`` ({} for an undeclared kind): what
        ``pgjobs.Client(dsn, app=app)`` applies (it satisfies :class:`pgjobs.client.defaults.EnqueueDefaults`)."""
        handler = self.handlers.get(kind)
        return handler.enqueue_defaults() if handler is not None else {}

    def handler(self, kind: str) -> JobHandler | None:
        return self.handlers.get(kind)


HandlerResult = Awaitable[Any] | Any


def token_uuid(token: str | UUID) -> UUID:
    return token if isinstance(token, UUID) else UUID(token)

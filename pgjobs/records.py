"""Typed records returned by the client (one per SQL result shape)."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from typing import Any, Self
from uuid import UUID


class JobState(enum.StrEnum):
    WAITING = "waiting"
    SCHEDULED = "scheduled"
    PENDING = "pending"
    ACTIVE = "active"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


class _Row:
    """Builds a dataclass from a dict row, ignoring columns it does not know (forward-compatible)."""

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Self:
        names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
        values = {k: v for k, v in row.items() if k in names}
        if "state" in values and values["state"] is not None:
            values["state"] = JobState(values["state"])
        return cls(**values)


def slot_setters(cls: type, names: tuple[str, ...]) -> tuple[Callable[[Any, Any], None], ...]:
    """The slot setters of a frozen, slotted dataclass, for hot paths that make many rows of it: setting the
    slots of ``object.__new__(cls)`` directly costs about two thirds of the frozen ``__init__`` (one
    ``object.__setattr__`` call a field). ``names`` must be the fields in order, so that a new field fails
    at import instead of leaving rows half made (pgjobs/client/stream.py, pgjobs/client/enqueue.py)."""
    if tuple(f.name for f in fields(cls)) != names:
        raise RuntimeError(f"{cls.__name__}'s fields changed: update the code that sets {names}")
    return tuple(cls.__dict__[name].__set__ for name in names)


@dataclass(frozen=True, slots=True)
class Enqueued(_Row):
    id: int
    created: bool
    state: JobState


@dataclass(frozen=True, slots=True)
class EnqueuedSpec(_Row):
    ref: str | None
    id: int
    created: bool
    batch_id: int | None


@dataclass(frozen=True, slots=True)
class ClaimedJob(_Row):
    id: int
    kind: str
    queue: str
    payload: Any
    meta: dict[str, Any]
    attempt: int
    max_attempts: int
    lease_token: UUID
    lease_expires_at: datetime
    checkpoint: Any
    group_key: str | None
    batch_id: int | None
    first_started_at: datetime | None


@dataclass(frozen=True, slots=True)
class Job(_Row):
    id: int
    kind: str
    queue: str
    payload: Any
    meta: dict[str, Any]
    state: JobState
    priority: int
    run_at: datetime
    created_at: datetime
    attempt: int
    max_attempts: int
    lease_token: UUID | None
    leased_by: str | None
    lease_expires_at: datetime | None
    first_started_at: datetime | None
    completed_at: datetime | None
    last_error: str | None
    errors: list[dict[str, Any]]
    checkpoint: Any
    progress: Any
    result: Any
    unique_key: str | None
    unique_live_only: bool
    group_key: str | None
    batch_id: int | None
    remaining_deps: int
    failed_deps: int
    schedule_name: str | None
    cancel_requested: bool


@dataclass(frozen=True, slots=True)
class JobStatus(Job):
    """``job_status()``: the job plus ``depends_on`` (``[{"job"|"batch": id, "on": trigger}]``)."""

    depends_on: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class QueueSettings(_Row):
    queue: str
    max_length: int | None
    paused: bool
    fair: bool
    noisy_share: float
    noisy_min_active: int
    max_active_per_group: int | None
    max_active: int | None
    status_events: str
    updated_at: datetime
    retention: timedelta | None = None  # finished jobs are dropped this long after they ended (None: kept)


@dataclass(frozen=True, slots=True)
class RateLimit(_Row):
    """One limit: at most ``max_starts`` starts in any window of ``per`` (+ ``burst``). ``scope``: ``key`` (a
    ``rate_key``) or ``queue``. ``tokens``: the starts a claim could take now; ``next_token_at``: when the
    next one is due (now, while tokens are left)."""

    scope: str
    key: str
    max_starts: int
    per: timedelta
    burst: int
    tokens: int | None = None
    next_token_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class FairGroup(_Row):
    """A group in a fair queue's ring (``fair_ring_groups``): it had pending work at the queue's last claim.
    ``group_key`` None: the ungrouped jobs, which take turns as one group. ``last_served_at`` None: not served
    yet; ``served``: its place in the serving order (the ring's serve count when it was last served, 0: never);
    ``weight``: its share of the claims while several groups have work (1 unless ``configure_group`` set it)."""

    group_key: str | None
    last_served_at: datetime | None
    served: int
    weight: float


@dataclass(frozen=True, slots=True)
class QueueStat(_Row):
    queue: str
    state: JobState
    jobs: int


@dataclass(frozen=True, slots=True)
class WorkerInfo(_Row):
    id: str
    last_seen: datetime
    meta: dict[str, Any]
    started_at: datetime
    active_jobs: int
    # 'live' while it heartbeats, 'stale' once silent for three of its heartbeat intervals (list_workers)
    status: str = "live"

    @property
    def live(self) -> bool:
        return self.status == "live"


@dataclass(frozen=True, slots=True)
class UnhandledKind(_Row):
    """``unhandled_kinds()``: claimable jobs of ``kind`` in ``queue`` that no live worker takes (``served``:
    some live worker serves the queue, only not that kind). ``jobs`` counts those at the queue's head."""

    queue: str
    kind: str
    jobs: int
    oldest: datetime
    served: bool

    @property
    def reason(self) -> str:
        return "no live worker handles this kind" if self.served else "no live worker serves this queue"

    def describe(self) -> str:
        return f"{self.jobs} {self.kind} job(s) in queue {self.queue}: {self.reason}"


@dataclass(frozen=True, slots=True)
class Renewed(_Row):
    """A row of ``renew_leases``: the token still holds the job. ``renewed`` is False when the job was busy in
    another transaction (its end on the way, a cancel, a checkpoint) and was not renewed this time: not lost,
    ask again. A job left out of the answer is no longer held by its token."""

    id: int
    cancel_requested: bool
    renewed: bool = True


@dataclass(frozen=True, slots=True)
class Schedule(_Row):
    """A recurring schedule (a row of ``pgjobs.schedules``)."""

    name: str
    kind: str
    cron: str
    timezone: str
    payload: Any
    queue: str
    priority: int
    max_attempts: int
    missed: str
    code_defined: bool
    paused: bool
    next_run_at: datetime
    last_run_at: datetime | None
    last_job_id: int | None
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class Materialized(_Row):
    """One schedule advanced by ``materialize_schedules``: ``job_id`` is None for a skipped run (the 'skip'
    missed-run policy); ``created`` is false when the run's job already existed."""

    name: str
    expected_run_at: datetime
    next_run_at: datetime
    job_id: int | None
    created: bool


class BatchState(enum.StrEnum):
    EXECUTING = "executing"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def settled(self) -> bool:
        return self is not BatchState.EXECUTING


@dataclass(frozen=True, slots=True)
class BatchStatus:
    """``batch_status()``: counters (``pending`` = members not yet terminal), state and progress of a batch."""

    id: int
    state: BatchState
    total: int
    pending: int
    succeeded: int
    failed: int
    cancelled: int
    fraction_settled: float
    created_at: datetime
    started_at: datetime | None
    completed_at: datetime | None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> BatchStatus:
        names = {f.name for f in fields(cls)}
        values = {k: v for k, v in row.items() if k in names}
        values["state"] = BatchState(values["state"])
        return cls(**values)

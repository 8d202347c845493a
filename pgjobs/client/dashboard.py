"""What the dashboard reads and does beyond the core calls (sql/dashboard.sql), and the event log it follows.

:class:`AsyncDashboard` runs these calls on a pool (the dashboard's own, with short timeouts); the pages
combine them with the core :class:`~pgjobs.client.AsyncClient` calls. None of the records carries a lease
token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from pgjobs.client._call import AsyncRunner, Call, Rows, interval, scalar
from pgjobs.records import JobState, _Row


@dataclass(frozen=True, slots=True)
class JobRow(_Row):
    """A row of the job list (``dashboard_jobs``): what a table shows, no payload, no lease token."""

    id: int
    kind: str
    queue: str
    state: JobState
    priority: int
    run_at: datetime
    created_at: datetime
    attempt: int
    max_attempts: int
    leased_by: str | None
    first_started_at: datetime | None
    completed_at: datetime | None
    last_error: str | None
    unique_key: str | None
    group_key: str | None
    batch_id: int | None
    progress: Any
    cancel_requested: bool


@dataclass(frozen=True, slots=True)
class JobPage:
    jobs: list[JobRow]
    total: int


@dataclass(frozen=True, slots=True)
class QueueOverview(_Row):
    queue: str
    counts: dict[str, int]
    oldest_pending_seconds: float | None
    paused: bool
    fair: bool
    max_length: int | None
    max_active: int | None
    max_active_per_group: int | None
    noisy_share: float
    noisy_min_active: int
    status_events: str
    settings_at: datetime | None


@dataclass(frozen=True, slots=True)
class Throughput(_Row):
    minute: datetime
    succeeded: int
    failed: int
    cancelled: int


@dataclass(frozen=True, slots=True)
class GroupLoad(_Row):
    group_key: str
    pending: int
    scheduled: int
    active: int
    last_served_at: datetime | None


@dataclass(frozen=True, slots=True)
class WorkerView(_Row):
    id: str
    last_seen: datetime
    started_at: datetime
    meta: dict[str, Any]
    stale: bool
    running: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class BulkOutcome(_Row):
    id: int
    done: bool
    error: str | None


@dataclass(frozen=True, slots=True)
class Event(_Row):
    """One entry of the durable event log (``read_events``)."""

    event_id: int
    at: datetime
    id: int
    state: JobState
    queue: str
    kind: str
    attempt: int
    batch_id: int | None
    progress: Any


@dataclass(frozen=True, slots=True)
class JobFilter:
    """The job list's filter; None leaves a field out."""

    state: JobState | None = None
    queue: str | None = None
    kind: str | None = None
    search: str | None = None

    def params(self) -> dict[str, Any]:
        return {
            "state": None if self.state is None else self.state.value,
            "queue": self.queue,
            "kind": self.kind,
            "search": self.search,
        }


_FILTER_ARGS = (
    "only_state => %(state)s::pgjobs.job_state, only_queue => %(queue)s, only_kind => %(kind)s, search => %(search)s"
)


def _page(rows: Rows) -> JobPage:
    return JobPage([JobRow.from_row(r) for r in rows], int(rows[0]["total_rows"]) if rows else 0)


def jobs_call(flt: JobFilter, max_rows: int = 50, skip_rows: int = 0) -> Call[JobPage]:
    return Call(
        "SELECT * FROM pgjobs.dashboard_jobs("
        + _FILTER_ARGS
        + ", max_rows => %(max_rows)s, skip_rows => %(skip_rows)s)",
        {**flt.params(), "max_rows": max_rows, "skip_rows": skip_rows},
        _page,
    )


def count_jobs_call(flt: JobFilter) -> Call[int]:
    return Call("SELECT pgjobs.dashboard_count_jobs(" + _FILTER_ARGS + ")", flt.params(), lambda r: int(scalar(r)))


def state_counts_call(flt: JobFilter) -> Call[dict[str, int]]:
    """How many jobs the filter (its state left out) matches per state: the job list's tabs."""
    return Call(
        "SELECT state::text AS state, jobs FROM pgjobs.dashboard_state_counts("
        "only_queue => %(queue)s, only_kind => %(kind)s, search => %(search)s)",
        {"queue": flt.queue, "kind": flt.kind, "search": flt.search},
        lambda rows: {str(r["state"]): int(r["jobs"]) for r in rows},
    )


def job_states_call(ids: Sequence[int]) -> Call[dict[int, JobState]]:
    """The current state of each of these jobs (those that exist)."""
    return Call(
        "SELECT id, state::text AS state FROM pgjobs.status_snapshot(job_ids => %(ids)s::bigint[])",
        {"ids": list(ids)},
        lambda rows: {int(r["id"]): JobState(r["state"]) for r in rows},
    )


def queues_call() -> Call[list[QueueOverview]]:
    return Call("SELECT * FROM pgjobs.dashboard_queues()", {}, lambda rows: [QueueOverview.from_row(r) for r in rows])


def throughput_call(minutes: int = 60, queue: str | None = None) -> Call[list[Throughput]]:
    return Call(
        "SELECT * FROM pgjobs.dashboard_throughput(minutes => %(minutes)s, queue => %(queue)s)",
        {"minutes": minutes, "queue": queue},
        lambda rows: [Throughput.from_row(r) for r in rows],
    )


def groups_call(queue: str, max_rows: int = 100) -> Call[list[GroupLoad]]:
    return Call(
        "SELECT * FROM pgjobs.dashboard_groups(queue => %(queue)s, max_rows => %(max_rows)s)",
        {"queue": queue, "max_rows": max_rows},
        lambda rows: [GroupLoad.from_row(r) for r in rows],
    )


def workers_call(stale_after: float | timedelta = 30.0) -> Call[list[WorkerView]]:
    return Call(
        "SELECT * FROM pgjobs.dashboard_workers(stale_after => %(s)s)",
        {"s": interval(stale_after)},
        lambda rows: [WorkerView.from_row(r) for r in rows],
    )


def bulk_call(action: str, ids: Sequence[int] | None, flt: JobFilter, max_rows: int = 1000) -> Call[list[BulkOutcome]]:
    return Call(
        "SELECT * FROM pgjobs.dashboard_bulk(action => %(action)s, ids => %(ids)s::bigint[], "
        + _FILTER_ARGS
        + ", max_rows => %(max_rows)s)",
        {**flt.params(), "action": action, "ids": None if ids is None else list(ids), "max_rows": max_rows},
        lambda rows: [BulkOutcome.from_row(r) for r in rows],
    )


def trigger_schedule_call(name: str) -> Call[int]:
    return Call("SELECT pgjobs.trigger_schedule(name => %(name)s)", {"name": name}, lambda r: int(scalar(r)))


def has_event_log_call() -> Call[bool]:
    return Call(
        "SELECT to_regprocedure('pgjobs.read_events(bigint, integer, text, bigint[], bigint)') IS NOT NULL",
        {},
        lambda r: bool(scalar(r)),
    )


def stream_head_call() -> Call[int]:
    """The newest event id of the log (``stream_head``), 0 when empty."""
    return Call("SELECT newest_id FROM pgjobs.stream_head()", {}, lambda r: int(scalar(r) or 0))


def read_events_call(
    after_id: int = 0, max_rows: int = 1000, job_ids: Sequence[int] | None = None, batch_id: int | None = None
) -> Call[list[Event]]:
    return Call(
        "SELECT * FROM pgjobs.read_events(after_id => %(after)s, max_rows => %(max_rows)s,"
        " job_ids => %(job_ids)s::bigint[], batch_id => %(batch_id)s)",
        {
            "after": after_id,
            "max_rows": max_rows,
            "job_ids": None if job_ids is None else list(job_ids),
            "batch_id": batch_id,
        },
        lambda rows: [Event.from_row(r) for r in rows],
    )


class AsyncDashboard(AsyncRunner):
    """The dashboard's calls on a pool: ``AsyncDashboard(pool)``."""

    def __init__(self, pool: Any) -> None:
        self._pool = pool

    async def jobs(self, flt: JobFilter, max_rows: int = 50, skip_rows: int = 0) -> JobPage:
        page = await self._run(jobs_call(flt, max_rows, skip_rows))
        if not page.jobs and skip_rows > 0:  # past the end: the rows cannot say how many there are
            return JobPage([], await self._run(count_jobs_call(flt)))
        return page

    async def state_counts(self, flt: JobFilter) -> dict[str, int]:
        return await self._run(state_counts_call(flt))

    async def job_states(self, ids: Sequence[int]) -> dict[int, JobState]:
        return await self._run(job_states_call(ids))

    async def queues(self) -> list[QueueOverview]:
        return await self._run(queues_call())

    async def throughput(self, minutes: int = 60, queue: str | None = None) -> list[Throughput]:
        return await self._run(throughput_call(minutes, queue))

    async def groups(self, queue: str, max_rows: int = 100) -> list[GroupLoad]:
        return await self._run(groups_call(queue, max_rows))

    async def workers(self, stale_after: float | timedelta = 30.0) -> list[WorkerView]:
        return await self._run(workers_call(stale_after))

    async def bulk(
        self, action: str, ids: Sequence[int] | None, flt: JobFilter, max_rows: int = 1000
    ) -> list[BulkOutcome]:
        return await self._run(bulk_call(action, ids, flt, max_rows))

    async def trigger_schedule(self, name: str) -> int:
        return await self._run(trigger_schedule_call(name))

    async def has_event_log(self) -> bool:
        return await self._run(has_event_log_call())

    async def stream_head(self) -> int:
        return await self._run(stream_head_call())

    async def read_events(
        self,
        after_id: int = 0,
        max_rows: int = 1000,
        job_ids: Sequence[int] | None = None,
        batch_id: int | None = None,
    ) -> list[Event]:
        return await self._run(read_events_call(after_id, max_rows, job_ids, batch_id))

"""Recurring jobs: schedules (sql/recurring.sql) and the code-defined schedule declaration.

Two kinds of schedule share one table:

* **code-defined** ones, declared by the application (``@app.periodic(...)``, which appends a
  :class:`PeriodicSpec` to ``app.periodic_specs``) and synchronised at worker start by
  :meth:`pgjobs.runtime.scheduler.Scheduler.sync_code_schedules` (added, updated, obsolete ones pruned);
* **dynamic** ones, added at run time with :meth:`RecurringOps.add_schedule`. A dynamic schedule never
  replaces or deletes a code-defined one (:class:`~pgjobs.errors.InvalidState`, PJ004).

The cron arithmetic is Python's (:mod:`pgjobs.cron`, croniter, in the schedule's IANA time zone); the
methods here that take a cron compute ``next_run_at`` and leave the rest to SQL.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, Literal

from pgjobs.client._call import AsyncConn, AsyncRunner, Call, SyncConn, SyncRunner, jsonb, scalar
from pgjobs.cron import check_cron, next_fire, zone
from pgjobs.errors import InvalidArgument
from pgjobs.records import Materialized, Schedule

# Serialises concurrent code-schedule synchronisations (several workers starting at once): each sync
# upserts then prunes, and two syncs of different declarations would otherwise lock rows in opposite
# orders. Run first in the sync's transaction.
SYNC_CODE_SCHEDULES_LOCK_SQL: Final = "SELECT pg_advisory_xact_lock(hashtextextended('pgjobs.sync_code_schedules', 0))"
# The scheduler's wake-up channel: every change of pgjobs.schedules notifies it.
SCHEDULES_CHANNEL: Final = "pgjobs_schedules"
LISTEN_SCHEDULES_SQL: Final = "LISTEN pgjobs_schedules"

Missed = Literal["once", "skip"]


@dataclass(frozen=True, slots=True)
class PeriodicSpec:
    """A code-defined schedule, as ``@app.periodic(cron=..., timezone=..., name=...)`` declares it.

    ``name`` is the schedule's name (unique); ``kind`` the job kind it enqueues (by default the name).
    ``missed`` is the policy after downtime: ``"once"`` runs the missed run once then continues at the
    next future time, ``"skip"`` goes straight to the next future time.
    """

    name: str
    cron: str
    kind: str = ""
    timezone: str = "UTC"
    payload: dict[str, Any] = field(default_factory=dict)
    queue: str = "default"
    priority: int = 0
    max_attempts: int = 20
    missed: Missed = "once"

    def __post_init__(self) -> None:
        if not self.kind:
            object.__setattr__(self, "kind", self.name)
        if self.payload is None:
            object.__setattr__(self, "payload", {})
        self.validate()

    def validate(self) -> None:
        """Raises InvalidArgument naming the bad value (the same checks the SQL makes, plus the cron)."""
        if not self.name:
            raise InvalidArgument(f"schedule name must be a non-empty string, got {self.name!r}")
        if not self.queue:
            raise InvalidArgument(f"schedule {self.name!r}: queue must be a non-empty string, got {self.queue!r}")
        if self.missed not in ("once", "skip"):
            raise InvalidArgument(f"schedule {self.name!r}: missed must be 'once' or 'skip', got {self.missed!r}")
        if self.max_attempts < 1:
            raise InvalidArgument(f"schedule {self.name!r}: max_attempts must be >= 1, got {self.max_attempts}")
        check_cron(self.cron)
        zone(self.timezone)


def _now(now: datetime | None) -> datetime:
    return datetime.now(UTC) if now is None else now


def _schedule(rows: list[dict[str, Any]]) -> Schedule:
    return Schedule.from_row(rows[0])


def _schedules(rows: list[dict[str, Any]]) -> list[Schedule]:
    return [Schedule.from_row(r) for r in rows]


def upsert_schedule_call(
    name: str,
    kind: str,
    cron: str,
    next_run_at: datetime,
    *,
    timezone: str = "UTC",
    payload: Any = None,
    queue: str = "default",
    code_defined: bool = False,
    priority: int = 0,
    max_attempts: int = 20,
    missed: str = "once",
    keep_next_run_at: bool = False,
) -> Call[Schedule]:
    return Call(
        "SELECT * FROM pgjobs.upsert_schedule(name => %(name)s, kind => %(kind)s, cron => %(cron)s,"
        " next_run_at => %(next_run_at)s, timezone => %(timezone)s, payload => %(payload)s, queue => %(queue)s,"
        " code_defined => %(code_defined)s, priority => %(priority)s, max_attempts => %(max_attempts)s,"
        " missed => %(missed)s, keep_next_run_at => %(keep)s)",
        {
            "name": name,
            "kind": kind,
            "cron": cron,
            "next_run_at": next_run_at,
            "timezone": timezone,
            "payload": jsonb({} if payload is None else payload),
            "queue": queue,
            "code_defined": code_defined,
            "priority": priority,
            "max_attempts": max_attempts,
            "missed": missed,
            "keep": keep_next_run_at,
        },
        _schedule,
    )


def spec_call(spec: PeriodicSpec, next_run_at: datetime, *, code_defined: bool) -> Call[Schedule]:
    """The upsert of a declared schedule: an unchanged cron and time zone keep the stored next_run_at."""
    return upsert_schedule_call(
        spec.name,
        spec.kind,
        spec.cron,
        next_run_at,
        timezone=spec.timezone,
        payload=spec.payload,
        queue=spec.queue,
        code_defined=code_defined,
        priority=spec.priority,
        max_attempts=spec.max_attempts,
        missed=spec.missed,
        keep_next_run_at=True,
    )


def pause_schedule_call(name: str) -> Call[bool]:
    return Call("SELECT pgjobs.pause_schedule(name => %(name)s)", {"name": name}, scalar)


def resume_schedule_call(name: str, next_run_at: datetime | None) -> Call[bool]:
    return Call(
        "SELECT pgjobs.resume_schedule(name => %(name)s, next_run_at => %(next)s)",
        {"name": name, "next": next_run_at},
        scalar,
    )


def remove_schedule_call(name: str, force: bool) -> Call[bool]:
    return Call(
        "SELECT pgjobs.remove_schedule(name => %(name)s, force => %(force)s)", {"name": name, "force": force}, scalar
    )


def prune_code_schedules_call(keep: Sequence[str]) -> Call[int]:
    return Call("SELECT pgjobs.prune_code_schedules(keep => %(keep)s::text[])", {"keep": list(keep)}, scalar)


def get_schedule_call(name: str) -> Call[Schedule | None]:
    return Call(
        "SELECT * FROM pgjobs.get_schedule(name => %(name)s)",
        {"name": name},
        lambda rows: Schedule.from_row(rows[0]) if rows else None,
        read=True,
    )


def list_schedules_call() -> Call[list[Schedule]]:
    return Call("SELECT * FROM pgjobs.list_schedules()", {}, _schedules, read=True)


def due_schedules_call(now: datetime, max_rows: int, skip_locked: bool = False) -> Call[list[Schedule]]:
    return Call(
        "SELECT * FROM pgjobs.due_schedules(now => %(now)s, max_rows => %(max_rows)s, skip_locked => %(skip)s)",
        {"now": now, "max_rows": max_rows, "skip": skip_locked},
        _schedules,
    )


def next_schedule_at_call(except_names: Sequence[str] = ()) -> Call[datetime | None]:
    return Call(
        "SELECT pgjobs.next_schedule_at(except_names => %(names)s::text[])",
        {"names": list(except_names) or None},
        scalar,
    )


def materialize_schedule_call(name: str, expected_run_at: datetime, next_run_at: datetime) -> Call[int | None]:
    return Call(
        "SELECT pgjobs.materialize_schedule(name => %(name)s, expected_run_at => %(expected)s,"
        " next_run_at => %(next)s)",
        {"name": name, "expected": expected_run_at, "next": next_run_at},
        scalar,
    )


@dataclass(frozen=True, slots=True)
class Run:
    """One planned step of a schedule: from ``expected_run_at`` to ``next_run_at``, with a job unless ``skip``."""

    name: str
    expected_run_at: datetime
    next_run_at: datetime
    skip: bool = False


def materialize_schedules_call(runs: Sequence[Run]) -> Call[list[Materialized]]:
    return Call(
        "SELECT * FROM pgjobs.materialize_schedules(names => %(names)s::text[],"
        " expected_run_ats => %(expected)s::timestamptz[], next_run_ats => %(next)s::timestamptz[],"
        " skip_runs => %(skip)s::boolean[])",
        {
            "names": [r.name for r in runs],
            "expected": [r.expected_run_at for r in runs],
            "next": [r.next_run_at for r in runs],
            "skip": [r.skip for r in runs],
        },
        lambda rows: [Materialized.from_row(r) for r in rows],
    )


def _declared(
    name: str,
    kind: str,
    cron: str,
    timezone: str,
    payload: Any,
    queue: str,
    priority: int,
    max_attempts: int,
    missed: str,
    now: datetime | None,
) -> tuple[PeriodicSpec, datetime]:
    spec = PeriodicSpec(
        name=name,
        kind=kind,
        cron=cron,
        timezone=timezone,
        payload=payload if payload is not None else {},
        queue=queue,
        priority=priority,
        max_attempts=max_attempts,
        missed=missed,  # type: ignore[arg-type]  # validated by PeriodicSpec
    )
    return spec, next_fire(cron, timezone, _now(now))


class RecurringOps(SyncRunner):
    def add_schedule(
        self,
        name: str,
        kind: str,
        cron: str,
        *,
        timezone: str = "UTC",
        payload: Any = None,
        queue: str = "default",
        priority: int = 0,
        max_attempts: int = 20,
        missed: Missed = "once",
        now: datetime | None = None,
        conn: SyncConn | None = None,
    ) -> Schedule:
        """Adds (or updates) the dynamic schedule ``name``, which enqueues a ``kind`` job at every run of
        ``cron`` in ``timezone``. Its first run is the next one after ``now`` (default: the current time);
        re-adding it with an unchanged cron and time zone keeps its pending run. PJ004 (InvalidState) if
        ``name`` is code-defined."""
        spec, first = _declared(name, kind, cron, timezone, payload, queue, priority, max_attempts, missed, now)
        return self._run(spec_call(spec, first, code_defined=False), conn)

    def upsert_schedule(
        self,
        name: str,
        kind: str,
        cron: str,
        next_run_at: datetime,
        *,
        timezone: str = "UTC",
        payload: Any = None,
        queue: str = "default",
        code_defined: bool = False,
        priority: int = 0,
        max_attempts: int = 20,
        missed: Missed = "once",
        keep_next_run_at: bool = False,
        conn: SyncConn | None = None,
    ) -> Schedule:
        """The raw SQL ``upsert_schedule``: ``next_run_at`` is taken as given (the cron is not checked here)."""
        return self._run(
            upsert_schedule_call(
                name,
                kind,
                cron,
                next_run_at,
                timezone=timezone,
                payload=payload,
                queue=queue,
                code_defined=code_defined,
                priority=priority,
                max_attempts=max_attempts,
                missed=missed,
                keep_next_run_at=keep_next_run_at,
            ),
            conn,
        )

    def pause_schedule(self, name: str, *, conn: SyncConn | None = None) -> bool:
        """Pauses ``name``: True if this call paused it, False if it was paused already (JobNotFound if unknown)."""
        return self._run(pause_schedule_call(name), conn)

    def resume_schedule(
        self, name: str, *, catch_up: bool = False, now: datetime | None = None, conn: SyncConn | None = None
    ) -> bool:
        """Unpauses ``name``; True if this call resumed it, False if it was not paused. By default it restarts at
        its next run after ``now`` (runs that fell in the pause are not made up); ``catch_up=True`` keeps its old
        next run, so its missed-run policy applies."""
        next_run_at = None
        if not catch_up:
            current = self.get_schedule(name, conn=conn)
            if current is not None and current.paused:
                next_run_at = next_fire(current.cron, current.timezone, _now(now))
        return self._run(resume_schedule_call(name, next_run_at), conn)

    def remove_schedule(self, name: str, *, force: bool = False, conn: SyncConn | None = None) -> bool:
        """Deletes a dynamic schedule; a code-defined one raises InvalidState (PJ004) unless ``force``."""
        return self._run(remove_schedule_call(name, force), conn)

    def prune_code_schedules(self, keep: Sequence[str], *, conn: SyncConn | None = None) -> int:
        return self._run(prune_code_schedules_call(keep), conn)

    def get_schedule(self, name: str, *, conn: SyncConn | None = None) -> Schedule | None:
        return self._run(get_schedule_call(name), conn)

    def list_schedules(self, *, conn: SyncConn | None = None) -> list[Schedule]:
        return self._run(list_schedules_call(), conn)

    def due_schedules(
        self, now: datetime | None = None, max_rows: int = 100, *, conn: SyncConn | None = None
    ) -> list[Schedule]:
        return self._run(due_schedules_call(_now(now), max_rows), conn)

    def materialize_schedule(
        self, name: str, expected_run_at: datetime, next_run_at: datetime, *, conn: SyncConn | None = None
    ) -> int | None:
        """Enqueues the run ``expected_run_at`` of ``name`` and advances it to ``next_run_at``, exactly once:
        the job id, or None when another scheduler (or a pause, a change) got there first."""
        return self._run(materialize_schedule_call(name, expected_run_at, next_run_at), conn)

    def materialize_schedules(self, runs: Sequence[Run], *, conn: SyncConn | None = None) -> list[Materialized]:
        return self._run(materialize_schedules_call(runs), conn)


class AsyncRecurringOps(AsyncRunner):
    async def add_schedule(
        self,
        name: str,
        kind: str,
        cron: str,
        *,
        timezone: str = "UTC",
        payload: Any = None,
        queue: str = "default",
        priority: int = 0,
        max_attempts: int = 20,
        missed: Missed = "once",
        now: datetime | None = None,
        conn: AsyncConn | None = None,
    ) -> Schedule:
        spec, first = _declared(name, kind, cron, timezone, payload, queue, priority, max_attempts, missed, now)
        return await self._run(spec_call(spec, first, code_defined=False), conn)

    async def upsert_schedule(
        self,
        name: str,
        kind: str,
        cron: str,
        next_run_at: datetime,
        *,
        timezone: str = "UTC",
        payload: Any = None,
        queue: str = "default",
        code_defined: bool = False,
        priority: int = 0,
        max_attempts: int = 20,
        missed: Missed = "once",
        keep_next_run_at: bool = False,
        conn: AsyncConn | None = None,
    ) -> Schedule:
        return await self._run(
            upsert_schedule_call(
                name,
                kind,
                cron,
                next_run_at,
                timezone=timezone,
                payload=payload,
                queue=queue,
                code_defined=code_defined,
                priority=priority,
                max_attempts=max_attempts,
                missed=missed,
                keep_next_run_at=keep_next_run_at,
            ),
            conn,
        )

    async def pause_schedule(self, name: str, *, conn: AsyncConn | None = None) -> bool:
        return await self._run(pause_schedule_call(name), conn)

    async def resume_schedule(
        self, name: str, *, catch_up: bool = False, now: datetime | None = None, conn: AsyncConn | None = None
    ) -> bool:
        next_run_at = None
        if not catch_up:
            current = await self.get_schedule(name, conn=conn)
            if current is not None and current.paused:
                next_run_at = next_fire(current.cron, current.timezone, _now(now))
        return await self._run(resume_schedule_call(name, next_run_at), conn)

    async def remove_schedule(self, name: str, *, force: bool = False, conn: AsyncConn | None = None) -> bool:
        return await self._run(remove_schedule_call(name, force), conn)

    async def prune_code_schedules(self, keep: Sequence[str], *, conn: AsyncConn | None = None) -> int:
        return await self._run(prune_code_schedules_call(keep), conn)

    async def get_schedule(self, name: str, *, conn: AsyncConn | None = None) -> Schedule | None:
        return await self._run(get_schedule_call(name), conn)

    async def list_schedules(self, *, conn: AsyncConn | None = None) -> list[Schedule]:
        return await self._run(list_schedules_call(), conn)

    async def due_schedules(
        self, now: datetime | None = None, max_rows: int = 100, *, conn: AsyncConn | None = None
    ) -> list[Schedule]:
        return await self._run(due_schedules_call(_now(now), max_rows), conn)

    async def materialize_schedule(
        self, name: str, expected_run_at: datetime, next_run_at: datetime, *, conn: AsyncConn | None = None
    ) -> int | None:
        return await self._run(materialize_schedule_call(name, expected_run_at, next_run_at), conn)

    async def materialize_schedules(self, runs: Sequence[Run], *, conn: AsyncConn | None = None) -> list[Materialized]:
        return await self._run(materialize_schedules_call(runs), conn)

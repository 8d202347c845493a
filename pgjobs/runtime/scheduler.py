"""The scheduler: turns due schedules into jobs, exactly once, however many schedulers run.

It runs in the worker process (on by default) and standalone as ``pgjobs.runtime.scheduler``. Each pass
(:meth:`Scheduler.tick`) runs, per batch, one transaction: lock due schedules with ``SKIP LOCKED``
(racing schedulers split the due set instead of queueing on the same rows), compute every next run in
Python (:mod:`pgjobs.cron`, in the schedule's time zone), and ``materialize_schedules``, which advances
each schedule only if it is still at the run it was due for, and inserts the run's job, in that same
transaction. A scheduler that dies at any point leaves either nothing or everything; the job's unique
key per (schedule, run time) is the second fence.

Between passes it sleeps until the next due schedule (``next_schedule_at``), or until a NOTIFY on
``pgjobs_schedules`` says the schedules changed, at most ``max_sleep`` (NOTIFY is not durable).

Missed runs. A run is *late* when the scheduler gets to it more than ``grace`` (default 60 s) after its
time: the scheduler was down, or the schedule resumed with an old next run. Then the schedule's
``missed`` policy decides: ``"once"`` enqueues that run once (its ``run_at`` is the missed time) and
continues at the next run after now, all missed runs in between coalesced into it; ``"skip"`` enqueues
nothing and continues at the next run after now. A run that is not late is enqueued and the schedule
moves to the run after it.

Time: every decision uses ``clock()`` (default: the system's UTC clock), so tests can drive hours of
schedule in milliseconds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import Any, Self

import anyio
import psycopg
from anyio.abc import TaskStatus
from psycopg_pool import AsyncConnectionPool

from pgjobs.client import AsyncClient
from pgjobs.client.recurring import (
    LISTEN_SCHEDULES_SQL,
    SCHEDULES_CHANNEL,
    SYNC_CODE_SCHEDULES_LOCK_SQL,
    PeriodicSpec,
    Run,
    due_schedules_call,
    materialize_schedules_call,
    next_schedule_at_call,
    prune_code_schedules_call,
    spec_call,
)
from pgjobs.cron import next_fire
from pgjobs.errors import InvalidArgument, PgJobsError, QueueFull
from pgjobs.records import Materialized, Schedule
from pgjobs.runtime.logs import Outage

log = logging.getLogger("pgjobs.scheduler")

CHANNEL = SCHEDULES_CHANNEL
# How long a pass may hold off a stop (see Scheduler._loop): far above a pass's usual milliseconds (10,000 due
# schedules take about a second), only a bound for a database that stopped answering.
PASS_SHIELD = 60.0
# How long the LISTEN statement may hold off a stop (see Scheduler._listen): a bound for a database that
# stopped answering, never reached by one that answers.
LISTEN_SHIELD = 10.0


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class SyncReport:
    """What :func:`sync_code_schedules` did: the declared schedules as stored, and how many obsolete
    code-defined schedules it deleted."""

    schedules: list[Schedule]
    pruned: int


def plan_run(schedule: Schedule, now: datetime, *, grace: timedelta, error_backoff: timedelta) -> Run:
    """The step a scheduler takes for a due ``schedule`` at ``now`` (see the module doc for the rules).

    A schedule whose cron or time zone cannot be evaluated (stored by another client) is moved
    ``error_backoff`` ahead without a job, and logged, rather than blocking the scheduler."""
    due = schedule.next_run_at
    try:
        if now - due > grace:
            return Run(schedule.name, due, next_fire(schedule.cron, schedule.timezone, now), schedule.missed == "skip")
        return Run(schedule.name, due, next_fire(schedule.cron, schedule.timezone, due))
    except InvalidArgument as exc:
        log.error("schedule %r cannot be evaluated (%s); retrying in %s", schedule.name, exc, error_backoff)
        return Run(schedule.name, due, max(due, now) + error_backoff, skip=True)


def _specs_of(app_or_specs: Any) -> list[PeriodicSpec]:
    specs = getattr(app_or_specs, "periodic_specs", app_or_specs)
    result = list(specs or [])
    for spec in result:
        if not isinstance(spec, PeriodicSpec):
            raise InvalidArgument(f"expected PeriodicSpec declarations, got {spec!r}")
    names = [s.name for s in result]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise InvalidArgument(f"periodic schedule name(s) declared twice: {', '.join(dupes)}")
    return sorted(result, key=lambda s: s.name)


async def sync_code_schedules(client: AsyncClient, app_or_specs: Any, *, now: datetime | None = None) -> SyncReport:
    """Makes the code-defined schedules match the declarations (an App with ``periodic_specs``, or a list
    of :class:`PeriodicSpec`), in one transaction: each is upserted as code-defined (an unchanged cron and
    time zone keep the pending run, so a restart does not lose a run that came due meanwhile), and the
    code-defined schedules no longer declared are pruned. Dynamic schedules are left alone."""
    specs = _specs_of(app_or_specs)
    at = utc_now() if now is None else now
    firsts = [next_fire(s.cron, s.timezone, at) for s in specs]
    # An App that declares no periodic job at all (say, a worker of another app sharing the database)
    # prunes nothing: it would otherwise delete every code-defined schedule. An explicit list prunes.
    prune = bool(specs) or not hasattr(app_or_specs, "periodic_specs")
    async with client.pool.connection() as conn, conn.transaction():
        await conn.execute(SYNC_CODE_SCHEDULES_LOCK_SQL)
        stored = [
            await client._run(spec_call(spec, first, code_defined=True), conn)
            for spec, first in zip(specs, firsts, strict=True)
        ]
        pruned = await client._run(prune_code_schedules_call([s.name for s in specs]), conn) if prune else 0
    if pruned:
        log.info("pruned %d code-defined schedule(s) no longer declared", pruned)
    return SyncReport(stored, pruned)


class Scheduler:
    """Materialises due schedules. ``Scheduler(dsn_or_pool, app=None, clock=...)``.

    ``dsn_or_pool``: a DSN, an ``AsyncConnectionPool`` (autocommit connections) or an ``AsyncClient``
    (``pool=`` also takes the pool, with the DSN as first argument; ``name`` labels the log lines).
    ``app``: an App whose ``periodic_specs`` are synchronised when :meth:`run` starts.
    ``clock``: returns the current time as an aware datetime (tests inject their own).
    ``batch_size``: schedules per transaction. ``grace``: how late a run may be and still count as on time.
    ``max_sleep``: the longest sleep between passes (heals a missed NOTIFY or clock jump).
    """

    def __init__(
        self,
        dsn_or_pool: str | AsyncConnectionPool[Any] | AsyncClient | Any,
        app: Any = None,
        *,
        clock: Callable[[], datetime] = utc_now,
        batch_size: int = 500,
        grace: timedelta = timedelta(seconds=60),
        max_sleep: float = 30.0,
        error_backoff: timedelta = timedelta(minutes=5),
        queue_full_backoff: timedelta = timedelta(seconds=5),
        pool: AsyncConnectionPool[Any] | None = None,
        name: str | None = None,
        listen_dsn: str | None = None,
        outage: Outage | None = None,
        prepare: bool = True,
    ) -> None:
        if batch_size < 1:
            raise InvalidArgument(f"batch_size must be >= 1, got {batch_size}")
        if hasattr(dsn_or_pool, "periodic_specs") and (app is None or isinstance(app, str)):
            # Also accepted: Scheduler(app, dsn, pool=...), the worker's order.
            dsn_or_pool, app = app, dsn_or_pool
        self._owns_client = False
        if pool is not None:
            self.client = AsyncClient(dsn_or_pool if isinstance(dsn_or_pool, str) else None, pool=pool, prepare=prepare)
        elif isinstance(dsn_or_pool, AsyncClient):
            self.client = dsn_or_pool
        elif isinstance(dsn_or_pool, str):
            self.client = AsyncClient(dsn_or_pool, min_size=1, max_size=2)
            self._owns_client = True
        elif isinstance(dsn_or_pool, AsyncConnectionPool):
            self.client = AsyncClient(pool=dsn_or_pool)
        else:
            raise InvalidArgument(f"Scheduler needs a DSN, an AsyncConnectionPool or an AsyncClient: {dsn_or_pool!r}")
        self.client.quiet_outages = True  # its passes log each outage once themselves
        self.name = name or "scheduler"
        self.app = app
        self.clock = clock
        self.batch_size = batch_size
        self.grace = grace
        self.max_sleep = max_sleep
        self.error_backoff = error_backoff
        self.queue_full_backoff = queue_full_backoff
        # schedules whose queue was full: name -> when (clock time) to try again
        self._held: dict[str, datetime] = {}
        self._wakeup = anyio.Event()
        self._opened = False
        self._listen_dsn = listen_dsn  # a direct connection for LISTEN when the pool goes through PgBouncer
        # The worker's view of the database, when it runs in one: a lost connection is then part of the worker's
        # one line per outage instead of lines of its own.
        self.outage = outage

    @property
    def listen_dsn(self) -> str:
        """Where the LISTEN connection goes: ``listen_dsn``, else the client's DSN, or its pool's conninfo."""
        if self._listen_dsn:
            return self._listen_dsn
        if self.client.dsn:
            return self.client.dsn
        conninfo = self.client.pool.conninfo
        if not isinstance(conninfo, str):
            raise InvalidArgument("the scheduler needs a DSN (or a pool with a string conninfo) to LISTEN")
        return conninfo

    async def open(self) -> None:
        if self._owns_client and not self._opened:
            await self.client.open()
        self._opened = True

    async def close(self) -> None:
        if self._owns_client and self._opened:
            await self.client.close()
        self._opened = False

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()

    async def sync_code_schedules(self, app: Any) -> SyncReport:
        """Upserts every declared periodic schedule of ``app`` as code-defined and prunes the obsolete ones."""
        await self.open()
        return await sync_code_schedules(self.client, app, now=self.clock())

    # -- one pass ---------------------------------------------------------------------------------------

    async def tick(self) -> int:
        """Materialises everything due at ``clock()``; returns how many runs it enqueued."""
        created, _ = await self._tick()
        return created

    async def _tick(self) -> tuple[int, int]:
        await self.open()
        now = self.clock()
        self._held = {n: t for n, t in self._held.items() if t > now}
        created = advanced = 0
        while True:
            batch = await self._batch(now)
            if batch is None:
                break
            _, results = batch
            created += sum(1 for r in results if r.created)
            advanced += len(results)
            # Go on while batches make progress: a schedule advanced to a run that is itself already
            # due (a frequent cron, a late pass within the grace period) comes back in the next batch.
            # A batch that moved nothing (rows held by other schedulers, full queues) would only come
            # back the same.
            if not results:
                break
        return created, advanced

    async def _batch(self, now: datetime) -> tuple[list[Schedule], list[Materialized]] | None:
        """One transaction: lock up to batch_size due schedules, plan them, materialise them."""
        try:
            async with self.client.pool.connection() as conn, conn.transaction():
                rows = await self.client._run(
                    due_schedules_call(now, self.batch_size + len(self._held), skip_locked=True), conn
                )
                due = [s for s in rows if s.name not in self._held][: self.batch_size]
                if not due:
                    return None
                runs = [plan_run(s, now, grace=self.grace, error_backoff=self.error_backoff) for s in due]
                return due, await self.client._run(materialize_schedules_call(runs), conn)
        except QueueFull:
            # One bounded queue is full: the whole batch rolled back. Redo it one schedule at a time,
            # so only the schedules of full queues wait (their run stays due, and is retried later).
            return await self._one_by_one(now)

    async def _one_by_one(self, now: datetime) -> tuple[list[Schedule], list[Materialized]] | None:
        due = await self.client._run(due_schedules_call(now, self.batch_size + len(self._held)))
        due = [s for s in due if s.name not in self._held][: self.batch_size]
        if not due:
            return None
        results: list[Materialized] = []
        for schedule in due:
            run = plan_run(schedule, now, grace=self.grace, error_backoff=self.error_backoff)
            try:
                done: list[Materialized] = await self.client._run(materialize_schedules_call([run]))
                results.extend(done)
            except QueueFull as exc:
                log.warning("schedule %r: %s; retrying in %s", schedule.name, exc, self.queue_full_backoff)
                self._held[schedule.name] = now + self.queue_full_backoff
        return due, results

    async def next_wakeup(self) -> datetime | None:
        """When the next pass is due: the earliest next run (of schedules not held back), or the end of a hold."""
        await self.open()
        candidates = [t for t in self._held.values()]
        nxt = await self.client._run(next_schedule_at_call(list(self._held)))
        if nxt is not None:
            candidates.append(nxt)
        return min(candidates) if candidates else None

    # -- the loop ---------------------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Runs until cancelled: syncs ``app``'s code-defined schedules (if any), then materialises due
        schedules, sleeping until the next one or until the schedules change. Database errors are logged
        and retried with backoff; ``task_status.started()`` is signalled before the first pass."""
        if self.app is not None:
            _specs_of(self.app)  # declaration mistakes (a name declared twice) fail here, at once
        await self.open()
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._listen)
                task_status.started()
                await self.loop()
        finally:
            await self.close()

    async def loop(self) -> None:
        failures = 0
        synced = self.app is None
        while True:
            # A fresh event before the pass: a NOTIFY that arrives during the pass wakes the next sleep.
            self._wakeup = anyio.Event()
            try:
                # First a connection, unshielded: while the database is down that wait lasts up to the
                # pool's timeout (30 s by default), and a stop must not sit it out. The pass then takes
                # the same idle connection from the pool.
                async with self.client.pool.connection():
                    pass
                # A pass is a few short transactions: shielded (for PASS_SHIELD seconds at most), a stop that
                # arrives meanwhile waits for its end instead of interrupting a query (psycopg then logs a
                # "query cancellation interrupted" warning and throws the connection away); the stop lands
                # at the sleep below.
                with anyio.CancelScope(shield=True), anyio.fail_after(PASS_SHIELD):
                    if not synced:
                        await self.sync_code_schedules(self.app)
                        synced = True
                    _, advanced = await self._tick()
                    wake_at = await self.next_wakeup()
                if failures:
                    if self.outage is not None and self.outage.down:
                        self.outage.restored("scheduler pass")
                    else:
                        log.info("%s: passes work again after %d failed one(s)", self.name, failures)
                failures = 0
            except (psycopg.Error, OSError, PgJobsError, TimeoutError) as exc:
                # The database is unreachable or refused (not migrated yet ...): keep trying, with backoff,
                # rather than bring down the worker this scheduler runs in.
                failures += 1
                delay = min(0.5 * 2**failures, self.max_sleep, RETRY_CAP)
                if self.outage is not None and isinstance(exc, psycopg.OperationalError | OSError):
                    self.outage.lost("scheduler pass", exc, delay)
                else:
                    # once per outage at WARNING (its retries at DEBUG), and once at INFO when a pass works again
                    level = logging.WARNING if failures == 1 else logging.DEBUG
                    log.log(level, "%s: pass failed (%s); retrying in %.1fs", self.name, _first_line(exc), delay)
            else:
                if wake_at is None:
                    delay = self.max_sleep
                else:
                    delay = min(max((wake_at - self.clock()).total_seconds(), 0.0), self.max_sleep)
                if delay == 0.0 and not advanced:
                    # Due, yet nothing moved: the rows are held by other schedulers' transactions, which
                    # commit in a moment. Do not spin meanwhile.
                    delay = 0.05
            with anyio.move_on_after(delay):
                await self._wakeup.wait()

    async def _listen(self) -> None:
        """Sets the wakeup event on every NOTIFY of pgjobs_schedules; reconnects with backoff."""
        backoff = 0.5
        failures = 0
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(self.listen_dsn, autocommit=True) as conn:
                    # Shielded: a stop that arrives during the round trip waits for its end. Interrupted, psycopg
                    # cancels the query, is interrupted again by the stop, throws the connection away and logs
                    # a warning (a worker stopped right after it started).
                    with anyio.CancelScope(shield=True, deadline=anyio.current_time() + LISTEN_SHIELD) as scope:
                        await conn.execute(LISTEN_SCHEDULES_SQL)
                    if scope.cancelled_caught:
                        raise psycopg.OperationalError(f"LISTEN did not answer within {LISTEN_SHIELD:g} s")
                    backoff = 0.5
                    if failures:
                        if self.outage is not None and self.outage.down:
                            self.outage.restored("scheduler LISTEN")
                        else:
                            log.info("%s: LISTEN connection back after %d failed attempt(s)", self.name, failures)
                    failures = 0
                    self._wakeup.set()  # changes made while we were not listening: look again
                    async for _ in conn.notifies():
                        self._wakeup.set()
            except (psycopg.Error, OSError) as exc:
                failures += 1
                if self.outage is not None and isinstance(exc, psycopg.OperationalError | OSError):
                    self.outage.lost("scheduler LISTEN", exc, backoff)
                else:
                    # one WARNING per outage, its retries at DEBUG
                    level = logging.WARNING if failures == 1 else logging.DEBUG
                    log.log(
                        level,
                        "%s: LISTEN connection lost (%s); reconnecting in %.1fs",
                        self.name,
                        _first_line(exc),
                        backoff,
                    )
                await anyio.sleep(backoff)
                backoff = min(backoff * 2, RETRY_CAP)


# The longest pause between two tries while the database is unreachable: after a failover (a multi-host DSN
# that finds the promoted standby) the schedules fire again within seconds, not after a doubled minute.
RETRY_CAP = 5.0


def _first_line(exc: BaseException) -> str:
    """An error's first line (psycopg's connection errors add hints on the lines after): one log line each."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__

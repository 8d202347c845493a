"""The worker runtime: claims jobs, runs their handlers, reports the outcome.

One process, one anyio task group (asyncio: psycopg's async connections need it):

* per served queue, a **claimer** on its own connection: ``claim(max_jobs = free capacity, kind_limits =
  {kind: free capacity} for every kind the app has a handler for)``. It claims again at once while calls come
  back full, and otherwise sleeps until a ``pgjobs_wake`` for its queue, a slot frees up after a full claim,
  or the poll fallback;
* per queue, ``capacity`` long-lived **slot** tasks that run the claimed jobs (no task spawn per job);
* one **listener** (``pgjobs/listen.py``): ``pgjobs_wake`` (payload: queue) wakes that queue's claimer,
  ``pgjobs_cancel`` (payload: job id) sets the running job's ``ctx.cancelled``; reconnects with backoff and
  jitter, and wakes every claimer after a reconnect (a wake sent meanwhile is lost);
* a **poller**: wakes the claimers every ``poll_interval`` and at the next due ``run_at`` (``next_due_at``);
* a **completer** on its own connection: whatever completions accumulated go out in one ``complete_many``
  (a lone job is flushed at once; under load the batch grows while the previous call is in flight);
* a **renewer**: every ``lease / 3`` one ``renew_leases`` for all held jobs. A job missing from its answer
  lost its lease (reclaimed elsewhere): its handler is cancelled and nothing is reported for it. A job
  reported ``cancel_requested`` gets ``ctx.cancelled`` set (the fallback for a missed ``pgjobs_cancel``);
* a **heartbeat**: ``worker_heartbeat(name, meta)`` and ``reap_workers`` every ``heartbeat_interval``; no reaping
  until ``reap_after`` has passed since the server started and since this worker last failed to reach it (after
  an outage every worker's heartbeat is stale, and the first one back would take the others' running jobs).

The same job claimed again by this worker (its lease ran out during an outage while the handler ran or its outcome
waited for the database) replaces the older attempt, which is interrupted as "lease lost".

A slot frees when the handler returns (its completion may still be in the completer's next batch).

Outcomes: return -> ``complete`` (batched); ``Retry`` -> ``fail(retry_at)``; ``Snooze`` -> ``release(run_at)``;
other exception -> ``fail(traceback)`` (``retry_at`` from the handler's ``retry`` policy, else the SQL backoff);
timeout -> ``fail("TimeoutError: ...")``; cancellation requested -> ``ack_cancel`` however the handler ended;
lease lost -> nothing (the token no longer holds the job); shutdown after the grace period -> ``release``.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import inspect
import json
import logging
import math
import os
import signal
import socket
import threading
import traceback
import uuid
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any, LiteralString

import anyio
import psycopg
from anyio.abc import TaskGroup
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from pgjobs.client.listen import Listener, backoff_delay
from pgjobs.errors import translate
from pgjobs.runtime.app import App, CancelFlag, JobContext, JobHandler, Retry, Snooze, SyncJobContext, when_to_datetime

log = logging.getLogger("pgjobs.worker")

WAKE_CHANNEL = "pgjobs_wake"
CANCEL_CHANNEL = "pgjobs_cancel"

# jsonb columns come back as text: json.loads on the payload when the job runs is several times cheaper than
# psycopg's jsonb loader, and meta is only parsed if a handler reads it. Array parameters go out as array
# literals built with str.join, which costs a fraction of psycopg's per-element list dumping.
_CLAIM_SQL: LiteralString = (
    "SELECT id, kind, queue, payload::text, attempt, max_attempts, lease_token::text, checkpoint::text, batch_id,"
    " meta::text FROM pgjobs.claim(worker => %s, queues => %s::text[], max_jobs => %s, lease => %s::interval,"
    " kind_limits => %s::jsonb)"
)
_COMPLETE_SQL: LiteralString = "SELECT pgjobs.complete_many(ids => %s::bigint[], lease_tokens => %s::uuid[])"
_COMPLETE_RESULTS_SQL: LiteralString = (
    "SELECT pgjobs.complete_many(ids => %s::bigint[], lease_tokens => %s::uuid[],"
    " results => ARRAY(SELECT nullif(r.e, 'null'::jsonb) FROM jsonb_array_elements(%s::jsonb)"
    " WITH ORDINALITY AS r(e, n) ORDER BY r.n))"
)
_PARENTS_SQL: LiteralString = "SELECT id, results::text FROM pgjobs.parent_results_many(ids => %s::bigint[])"
_RENEW_SQL: LiteralString = (
    "SELECT id, cancel_requested FROM pgjobs.renew_leases(ids => %s::bigint[], lease_tokens => %s::uuid[],"
    " lease => %s::interval)"
)
# A server that restarted less than stale_after ago has heard no worker for as long as it was down: nobody is
# reaped until every live worker had its chance to heartbeat again (else the first worker back would take the
# running jobs of all the others).
_REAP_SQL: LiteralString = (
    "SELECT CASE WHEN now() - pg_postmaster_start_time() >= %s::interval"
    " THEN pgjobs.reap_workers(stale_after => %s::interval) ELSE 0 END"
)
_NEXT_DUE_SQL: LiteralString = "SELECT extract(epoch FROM pgjobs.next_due_at(%s::text[]) - clock_timestamp())::float8"

# Every worker connection runs with jit off: the hot functions run generic plans whose cost estimates grow with
# the table, and past jit_above_cost (about 30,000 pending jobs) each claim spent ~27 ms compiling its plan
# for a statement that runs in under 1 ms.
_SESSION_OPTIONS = "-c jit=off"
# Reconnect backoff ceiling (before jitter) of the claim, completion and LISTEN connections. Retrying a dead
# server every ~2 s costs nothing, and bounds how long a worker idles after the server is back.
_RECONNECT_CAP = 2.0
# The worker's pool: how long a call waits for a connection (PoolTimeout is retried by _call), and how long the
# pool retries a failed connect before giving up on it (the next call that needs one tries again, at once).
_POOL_WAIT = 5.0
_POOL_RECONNECT = 3.0
# A claim needs no durable commit: if the server crashes before the claim's WAL reaches disk, the job simply
# comes back unclaimed (attempt not counted), and this worker's later calls for it fail the token compare-and-set
# (no-ops). Skipping the flush wait takes ~0.5 ms off every claim, i.e. off the wake-up latency.
_CLAIM_OPTIONS = _SESSION_OPTIONS + " -c synchronous_commit=off"

# A job's phases, for the renewer and the shutdown: only a RUNNING handler can be cancelled.
_QUEUED, _RUNNING, _FINISHING = 0, 1, 2


class _Job:
    """One claimed job held by this worker."""

    __slots__ = (
        "attempt",
        "batch_id",
        "checkpoint",
        "ctx",
        "handler",
        "id",
        "kind",
        "max_attempts",
        "meta",
        "parents",
        "payload",
        "phase",
        "queue",
        "scope",
        "stop_reason",
        "token",
    )

    def __init__(self, row: tuple[Any, ...], handler: JobHandler, queue: _Queue) -> None:
        (self.id, self.kind, _q, self.payload, self.attempt, self.max_attempts, self.token, self.checkpoint,
         self.batch_id, self.meta) = row  # fmt: skip
        self.handler = handler
        self.queue = queue
        self.phase = _QUEUED
        self.scope: anyio.CancelScope | None = None
        self.stop_reason: str | None = None  # why the worker cancelled the handler: timeout/lease/shutdown
        self.ctx: JobContext | SyncJobContext | None = None
        self.parents: str | None = None  # the parents' results (JSON text), for kinds that asked

    def interrupt(self, reason: str) -> None:
        """Cancels the running handler (first reason wins) and tells it through ctx.cancelled."""
        if self.stop_reason is None:
            self.stop_reason = reason
        if self.ctx is not None:
            self.ctx.cancelled.set(reason)
        if self.scope is not None and self.phase == _RUNNING:
            self.scope.cancel()


class _Queue:
    """Per served queue: capacity, the claimers' wake state, the ready jobs and the parked slots."""

    __slots__ = ("capacity", "chunk", "more", "name", "parked", "ready", "reserved", "running", "waiters")

    def __init__(self, name: str, capacity: int, claimers: int) -> None:
        self.name = name
        self.capacity = capacity
        self.chunk = -(-capacity // claimers)  # what one claim asks for at most
        self.running = 0  # claimed and not yet ended (queued in `ready` or running in a slot)
        self.reserved = 0  # asked for by claims in flight: never more than capacity - running in all
        self.more = True  # something may be claimable: claim when capacity allows
        self.waiters: dict[anyio.Event, str] = {}  # sleeping claimers -> what they wait for ("wake" | "slot")
        self.ready: deque[_Job] = deque()
        self.parked: list[anyio.Event] = []

    def poke(self, why: str) -> None:
        if self.waiters:
            for ev, waiting_for in list(self.waiters.items()):
                if why == "any" or why == waiting_for:
                    ev.set()


@dataclass(frozen=True, slots=True)
class WorkerStats:
    claimed: int
    completed: int
    failed: int
    released: int
    cancelled: int
    lost: int


def _array_literal(items: Sequence[str]) -> str:
    """A PostgreSQL array literal of text items, each quoted."""
    quoted = ['"' + i.replace("\\", "\\\\").replace('"', '\\"') + '"' for i in items]
    return "{" + ",".join(quoted) + "}"


def default_worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def _seconds(value: float | timedelta) -> float:
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


class Worker:
    """Runs an :class:`~pgjobs.App`'s handlers for jobs of the ``queues`` it serves.

    ``queues``: ``{"default": 10, "emails": 5}`` (queue -> how many jobs it runs at once), or a list of names
    that each get ``concurrency``. ``lease``: seconds a claim holds a job before another worker may take it
    (renewed every lease/3 while the handler runs). ``grace_period``: on stop, how long running jobs may
    finish before they are released. ``poll_interval``: the fallback beat when no notification comes.
    ``heartbeat_interval``: ``worker_heartbeat`` + ``reap_workers(reap_after)`` (default 6 heartbeats).
    ``scheduler``: also run the recurring-jobs scheduler (when ``pgjobs.runtime.scheduler`` is installed).
    ``durable_completions=False`` commits completions without waiting for the WAL flush (``synchronous_commit
    = off`` on the completer's connection): faster, above all with status events on (a notifying commit holds
    a cluster-wide lock through its flush), but a *server* crash can forget the last fraction of a second of
    completions; those jobs then run again when their leases expire (at least once, as after a worker crash),
    and a subscriber may have seen them succeed. Failures, releases and cancels are always durable.
    """

    def __init__(
        self,
        app: App,
        dsn: str,
        queues: Mapping[str, int] | Sequence[str] | None = None,
        *,
        lease: float | timedelta = 30.0,
        grace_period: float | timedelta = 30.0,
        poll_interval: float | timedelta = 5.0,
        name: str | None = None,
        scheduler: bool = True,
        heartbeat_interval: float | timedelta = 10.0,
        reap_after: float | timedelta | None = None,
        concurrency: int = 10,
        pool_size: int = 4,
        claimers: int | None = None,
        durable_completions: bool = True,
    ) -> None:
        if queues is None:
            queues = {"default": concurrency}
        elif not isinstance(queues, Mapping):
            queues = {q: concurrency for q in queues}
        if not queues:
            raise ValueError("a worker needs at least one queue")
        for q, n in queues.items():
            if not q:
                raise ValueError("queue names must be non-empty")
            if int(n) < 1:
                raise ValueError(f"concurrency of queue {q!r} must be >= 1, got {n}")
        self.app = app
        self.dsn = dsn
        self.queues: dict[str, int] = {q: int(n) for q, n in queues.items()}
        self.lease = _seconds(lease)
        self.grace_period = _seconds(grace_period)
        self.poll_interval = _seconds(poll_interval)
        self.heartbeat_interval = _seconds(heartbeat_interval)
        self.reap_after = _seconds(reap_after) if reap_after is not None else 6 * self.heartbeat_interval
        for label, value in (("lease", self.lease), ("poll_interval", self.poll_interval),
                             ("heartbeat_interval", self.heartbeat_interval)):  # fmt: skip
            if value <= 0:
                raise ValueError(f"{label} must be positive, got {value}")
        if self.grace_period < 0:
            raise ValueError(f"grace_period must be >= 0, got {self.grace_period}")
        self.name = name or default_worker_name()
        self.scheduler = scheduler
        self.pool_size = pool_size
        self.durable_completions = durable_completions

        self.claimers = claimers
        self._queues = [_Queue(q, n, self._claimers_for(n)) for q, n in self.queues.items()]
        self._by_queue = {q.name: q for q in self._queues}
        self._jobs: dict[int, _Job] = {}
        self._done: list[tuple[int, str, str | None]] = []  # (id, token, result json) awaiting complete_many
        self._in_flight: list[tuple[int, str, str | None]] = []
        self._completer_wait: anyio.Event | None = None
        self._backoff_wait: anyio.Event | None = None  # set when connection retries should not wait any longer
        self._poller_wait: anyio.Event | None = None
        self._stop_event: anyio.Event | None = None
        self._stopping = False
        self._hard_stop = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pool: AsyncConnectionPool[Any] | None = None
        self._limiter: anyio.CapacityLimiter | None = None
        self._lease_td = timedelta(seconds=self.lease)
        self._limits_cache: dict[int, str] = {}
        self._wants_parents = False  # any handler with parent_results=True (set when run() starts)
        self.listener: Listener | None = None
        self._cut_off_at: float | None = None  # anyio time of this worker's last failure to reach the database
        self.started = threading.Event()  # set once the worker claims (tests, CLI)
        self.claimed = self.completed = self.failed = self.released = self.cancelled = self.lost = 0
        self.claim_calls = self.complete_calls = 0

    # ------------------------------------------------------------------------------------------ control

    def _claimers_for(self, capacity: int) -> int:
        """Claim connections per queue (``claimers``, default 1). Measured: two concurrent claims of half the
        capacity each halve the throughput of no-op jobs (each claim skips the rows the other locked, and the
        fixed cost of a claim is paid twice as often), so one claimer asking for all free capacity it is."""
        return 1 if self.claimers is None else max(1, min(self.claimers, capacity))

    def stop(self, graceful: bool = True) -> None:
        """Asks the worker to stop: no more claims, running jobs get ``grace_period`` to finish (none when
        ``graceful`` is False), the rest are released. Safe from any thread and from signal handlers."""
        self._stopping = True
        if not graceful:
            self._hard_stop = True
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        # Always through the loop's queue: stop() may run in another thread or in a signal handler that
        # interrupted the loop's own code, where touching its state directly is not safe.
        with contextlib.suppress(RuntimeError):  # loop closing
            loop.call_soon_threadsafe(self._on_stop)

    def _on_stop(self) -> None:
        if self._stop_event is not None:
            self._stop_event.set()
        self._retry_now()
        for q in self._queues:
            q.poke("any")

    def run_sync(self) -> int:
        """Runs the worker until SIGINT/SIGTERM (graceful stop; a second signal releases at once). Returns 0."""
        installed: dict[signal.Signals, Any] = {}

        def on_signal(signum: int, frame: Any) -> None:
            if self._stopping:
                log.warning("second signal: releasing running jobs now")
                self.stop(graceful=False)
            else:
                log.info("signal %d: stopping (grace period %.1f s)", signum, self.grace_period)
                self.stop()

        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                installed[sig] = signal.signal(sig, on_signal)
        try:
            anyio.run(self.run)
        finally:
            for sig, previous in installed.items():
                signal.signal(sig, previous)
        return 0

    @property
    def stats(self) -> WorkerStats:
        return WorkerStats(self.claimed, self.completed, self.failed, self.released, self.cancelled, self.lost)

    @property
    def active(self) -> int:
        return sum(q.running for q in self._queues)

    # ------------------------------------------------------------------------------------------ run

    async def run(self) -> None:
        """Runs until :meth:`stop`; raises on fatal errors (schema missing, database unreachable at start)."""
        self._loop = asyncio.get_running_loop()
        self._stop_event = anyio.Event()
        if self._stopping:
            self._stop_event.set()
        self._limiter = anyio.CapacityLimiter(max(1, sum(self.queues.values())))
        self._wants_parents = any(h.parent_results for h in self.app.handlers.values())
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            self.dsn,
            min_size=1,
            max_size=max(2, self.pool_size),
            kwargs={
                "autocommit": True,
                "application_name": f"pgjobs-worker:{self.name}",
                "options": _SESSION_OPTIONS,
            },
            open=False,
            name=f"pgjobs-worker-{self.name}",
            # After a long outage psycopg_pool's own reconnect backoff (doubling up to reconnect_timeout, 5 min
            # by default) left the pool empty for ~30 s after the server was back, and every call waited out
            # the 30 s default timeout. Short attempts that give up and start again on demand, and a short
            # wait that _call retries, bring pooled calls back within a second or two of the server.
            timeout=_POOL_WAIT,
            reconnect_timeout=_POOL_RECONNECT,
        )
        self._pool = pool
        try:
            # One direct connect first: an unreachable server fails with its own clear error, not a pool timeout.
            probe = await self._connect("probe")
            await probe.close()
            await pool.open(wait=True, timeout=15)
            await self._heartbeat_once()  # fails fast on a missing schema or an unreachable database
            async with anyio.create_task_group() as services:
                listener = Listener(
                    self.dsn,
                    [WAKE_CHANNEL, CANCEL_CHANNEL],
                    on_connect=self._on_listen_connect,
                    cap=_RECONNECT_CAP,
                    application_name=f"pgjobs-listen:{self.name}",
                )
                self.listener = listener
                await services.start(listener.run, self._on_notify)
                services.start_soon(self._poller)
                services.start_soon(self._renewer)
                services.start_soon(self._heartbeat)
                await self._start_scheduler(services)
                async with anyio.create_task_group() as work:
                    work.start_soon(self._completer)
                    async with anyio.create_task_group() as jobs:
                        for q in self._queues:
                            for _ in range(q.capacity):
                                jobs.start_soon(self._slot, q)
                            for _ in range(self._claimers_for(q.capacity)):
                                jobs.start_soon(self._claimer, q)
                        self.started.set()
                        await self._stop_event.wait()
                        await self._drain(jobs)
                    # every slot ended: flush the last completions, then stop the completer
                    if self._jobs:
                        log.warning("%d job(s) could not be released; their leases will expire", len(self._jobs))
                        self._jobs.clear()
                    self._poke_completer()
                services.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await pool.close()
            self._pool = None

    async def _start_scheduler(self, tg: TaskGroup) -> None:
        """Hook for the recurring-jobs scheduler (pgjobs/scheduler.py): started in the worker's task group
        when ``scheduler=True`` and the module is installed."""
        if not self.scheduler:
            return
        if importlib.util.find_spec(f"{__package__}.scheduler") is None:
            return
        scheduler_mod = importlib.import_module(f"{__package__}.scheduler")
        sched = scheduler_mod.Scheduler(self.app, self.dsn, pool=self._pool, name=self.name)
        await tg.start(sched.run)

    async def _drain(self, jobs: TaskGroup) -> None:
        """Graceful end: claimers stop (they see _stopping), running jobs get the grace period, the rest are
        released; then the slots exit."""
        self._stopping = True
        for q in self._queues:
            q.poke("any")
        deadline = anyio.current_time() + (0.0 if self._hard_stop else self.grace_period)
        while self._jobs and anyio.current_time() < deadline and not self._hard_stop:
            await anyio.sleep(min(0.05, max(0.0, deadline - anyio.current_time())))
        if self._jobs:
            log.info("grace period over: releasing %d running job(s)", len(self._jobs))
            for job in list(self._jobs.values()):
                if job.phase == _QUEUED:
                    job.stop_reason = "shutdown"
                job.interrupt("shutdown")
            # releases take one round trip each; bounded so a dead database cannot hold the exit
            with anyio.move_on_after(max(5.0, self.lease / 3)):
                while self._jobs or self.active:
                    await anyio.sleep(0.01)
        for q in self._queues:
            for ev in q.parked:
                ev.set()
            q.parked.clear()
        if self._jobs or self.active:
            jobs.cancel_scope.cancel()

    # ------------------------------------------------------------------------------------------ notifications

    def _on_notify(self, channel: str, payload: str) -> None:
        if channel == WAKE_CHANNEL:
            q = self._by_queue.get(payload)
            if q is not None:
                q.more = True
                q.poke("wake")
        elif channel == CANCEL_CHANNEL:
            try:
                job = self._jobs.get(int(payload))
            except ValueError:
                return
            if job is not None and job.ctx is not None:
                job.ctx.cancelled.set("cancel requested")
            elif job is not None:
                job.stop_reason = "cancel requested"

    async def _on_listen_connect(self) -> None:
        # Notifications sent while the connection was down are lost: look again at every queue.
        self._wake_all()
        self._retry_now()  # the database is back: claimers and the completer in a backoff retry at once

    def _retry_now(self) -> None:
        ev = self._backoff_wait
        if ev is not None:
            self._backoff_wait = None
            ev.set()

    async def _backoff(self, delay: float) -> None:
        """The pause after a connection error: ``delay`` seconds, or less when the LISTEN connection is
        re-established meanwhile (the server is back) or the worker is asked to stop."""
        if self._backoff_wait is None:
            self._backoff_wait = anyio.Event()
        ev = self._backoff_wait
        with anyio.move_on_after(delay):
            await ev.wait()

    def _wake_all(self) -> None:
        for q in self._queues:
            q.more = True
            q.poke("wake")

    # ------------------------------------------------------------------------------------------ claiming

    async def _connect(self, role: str, options: str | None = None) -> psycopg.AsyncConnection[Any]:
        extra: dict[str, Any] = {} if options is None else {"options": options}
        return await psycopg.AsyncConnection.connect(
            self.dsn, autocommit=True, application_name=f"pgjobs-{role}:{self.name}", connect_timeout=10, **extra
        )

    def _kind_limits(self, free: int) -> str:
        text = self._limits_cache.get(free)
        if text is None:
            text = json.dumps({k: free for k in self.app.handlers})
            if len(self._limits_cache) < 4096:
                self._limits_cache[free] = text
        return text

    async def _claimer(self, q: _Queue) -> None:
        conn: psycopg.AsyncConnection[Any] | None = None
        cur: psycopg.AsyncCursor[Any] = None  # type: ignore[assignment]  # set with conn
        failures = 0
        queues = _array_literal([q.name])
        lease = f"{self.lease} seconds"
        handlers = self.app.handlers
        try:
            while not self._stopping:
                free = q.capacity - q.running - q.reserved
                if free <= 0 or not q.more or not handlers:
                    ev = anyio.Event()
                    q.waiters[ev] = "slot" if free <= 0 and q.more else "wake"
                    try:
                        await ev.wait()
                    finally:
                        del q.waiters[ev]
                    continue
                want = min(free, q.chunk)
                q.more = False  # a wake that arrives while this claim runs sets it again
                q.reserved += want
                try:
                    if conn is None or conn.closed:
                        conn = await self._connect("claim", _CLAIM_OPTIONS)
                        cur = conn.cursor()
                        if failures:
                            # Back from a connection failure (an outage?): the leases of the jobs we hold ran on
                            # meanwhile, and this claim would take our own expired jobs back (attempt + 1, run
                            # twice). Renew them first, on this connection that just proved the server is back.
                            await self._renew_held(conn)
                    await cur.execute(
                        _CLAIM_SQL, (self.name, queues, want, lease, self._kind_limits(want)), prepare=True
                    )
                    rows = await cur.fetchall()
                    self.claim_calls += 1
                    failures = 0
                except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                    failures += 1
                    self._cut_off_at = anyio.current_time()
                    delay = backoff_delay(failures, 0.05, _RECONNECT_CAP)
                    log.warning("claim on queue %r failed (%s); retrying in %.2f s", q.name, exc, delay)
                    if conn is not None:
                        await conn.close()
                        conn = None
                    q.more = True
                    await self._backoff(delay)
                    continue
                except psycopg.Error as exc:
                    raise translate(exc) from exc
                finally:
                    q.reserved -= want
                if len(rows) >= want:
                    q.more = True
                    q.poke("wake")  # a sibling claimer may take more meanwhile
                if rows:
                    parents = None
                    if self._wants_parents and any(
                        (h := handlers.get(r[1])) is not None and h.parent_results for r in rows
                    ):
                        parents = await self._parent_results(cur, rows)
                    self._dispatch(q, rows, parents)
        finally:
            if conn is not None:
                with anyio.CancelScope(shield=True):
                    await conn.close()

    async def _parent_results(self, cur: psycopg.AsyncCursor[Any], rows: list[tuple[Any, ...]]) -> dict[int, str]:
        """{job id: its parents' results as JSON text} for the claimed jobs whose kind asked for them.
        On the claim connection, right after the claim: a connection error here loses nothing (the jobs run
        with ctx.parent_results = None rather than wait)."""
        handlers = self.app.handlers
        ids = [r[0] for r in rows if (h := handlers.get(r[1])) is not None and h.parent_results]
        try:
            await cur.execute(_PARENTS_SQL, ("{" + ",".join(map(str, ids)) + "}",), prepare=True)
            return {r[0]: r[1] for r in await cur.fetchall()}
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            log.warning("parent_results of %d claimed job(s) failed: %s", len(ids), exc)
            return {}

    def _dispatch(self, q: _Queue, rows: list[tuple[Any, ...]], parents: dict[int, str] | None = None) -> None:
        handlers = self.app.handlers
        jobs = self._jobs
        ready = q.ready
        n = 0
        for row in rows:
            handler = handlers.get(row[1])
            job = _Job(row, handler, q) if handler is not None else None
            if job is None:  # cannot happen with kind_limits; give it back rather than hold it
                log.error("claimed job %s of kind %r without a handler; releasing it", row[0], row[1])
                bogus = _Job(row, JobHandler(row[1], lambda p, c: None), q)
                jobs[bogus.id] = bogus
                bogus.stop_reason = "shutdown"
                ready.append(bogus)
                n += 1
                continue
            if job.handler.parent_results:
                job.parents = parents.get(job.id, "{}") if parents is not None else None
            held = jobs.get(job.id)
            if held is not None:
                # We hold this job already, under an older token: that attempt's lease ran out while its handler
                # ran or its outcome waited for the database (a server restart), and this very worker claimed
                # the job again. The new claim took the job from the old attempt, whose outcome no longer counts.
                held.interrupt("lease lost")
            jobs[job.id] = job
            ready.append(job)
            n += 1
        q.running += n
        self.claimed += n
        if self._stopping:  # claimed by a call that was in flight when stop() came: give them back
            for job in list(ready)[-n:]:
                job.stop_reason = "shutdown"
        parked = q.parked
        if parked:
            parked.pop().set()  # each woken slot wakes the next while jobs remain (see _slot)

    # ------------------------------------------------------------------------------------------ running

    async def _slot(self, q: _Queue) -> None:
        ready = q.ready
        parked = q.parked
        while True:
            if ready:
                job = ready.popleft()
                if ready and parked:
                    parked.pop().set()
                await self._run(job)
                continue
            if self._stopping and not self._jobs_of(q):
                return
            ev = anyio.Event()
            parked.append(ev)
            await ev.wait()
            if self._stopping and not ready and not self._jobs_of(q):
                return

    def _jobs_of(self, q: _Queue) -> bool:
        return q.running > 0

    async def _run(self, job: _Job) -> None:
        handler = job.handler
        q = job.queue
        try:
            if job.stop_reason == "shutdown":  # claimed but not started before the worker stopped
                job.phase = _FINISHING
                await self._release(job, None)
                return
            if job.stop_reason == "lease lost":  # claimed again before it started (see _dispatch)
                job.phase = _FINISHING
                self.lost += 1
                return
            payload = json.loads(job.payload)
            checkpoint = None if job.checkpoint is None else json.loads(job.checkpoint)
            flag = CancelFlag(threaded=not handler.is_async)
            ctx_cls = JobContext if handler.is_async else SyncJobContext
            ctx = ctx_cls(self, job.id, job.kind, q.name, job.attempt, job.max_attempts, job.token, checkpoint,
                          job.batch_id, job.meta, flag)  # fmt: skip
            job.ctx = ctx
            if job.parents is not None:
                ctx.parent_results = {int(k): v for k, v in json.loads(job.parents).items()}
            if job.stop_reason == "cancel requested":  # the cancel arrived before the slot picked it up
                flag.set("cancel requested")
            error: BaseException | None = None
            result: Any = None
            timeout = handler.timeout
            scope = anyio.CancelScope()
            job.scope = scope
            job.phase = _RUNNING
            # The timeout is a loop timer, not a scope deadline, so ctx.cancelled says "timeout" before the
            # handler sees the cancellation (and a sync handler in its thread can notice it).
            timer = None if timeout is None else self._loop_call_later(timeout, job.interrupt, "timeout")
            try:
                with scope:
                    if handler.is_async:
                        result = handler.func(payload, ctx)
                        if inspect.isawaitable(result):  # (a wrapper of an async def may be a plain def)
                            result = await result
                    else:
                        assert self._limiter is not None
                        result = await anyio.to_thread.run_sync(
                            partial(handler.func, payload, ctx), abandon_on_cancel=True, limiter=self._limiter
                        )
            except Exception as exc:
                error = exc
            finally:
                if timer is not None:
                    timer.cancel()
            job.phase = _FINISHING
            if scope.cancelled_caught or (scope.cancel_called and error is not None):
                await self._interrupted(job, job.stop_reason or "timeout")
            elif flag.is_set() and flag.reason == "cancel requested":
                await self._ack_cancel(job)
            elif error is None:
                try:
                    encoded = None if result is None else json.dumps(result)
                except (TypeError, ValueError) as exc:
                    await self._failed(job, TypeError(f"the handler's result is not JSON-serializable: {exc}"))
                else:
                    self._done.append((job.id, job.token, encoded))
                    self._poke_completer()
            else:
                await self._failed(job, error)
        finally:
            # Only this attempt's entry: after a re-claim of the same job (see _dispatch) the entry is the new one's.
            if self._jobs.get(job.id) is job:
                del self._jobs[job.id]
            q.running -= 1
            q.poke("slot")
            if self._stopping and q.running == 0:
                for ev in q.parked:  # the last job of a stopping worker: parked slots may exit now
                    ev.set()
                q.parked.clear()

    def _loop_call_later(self, delay: float, fn: Any, *args: Any) -> asyncio.TimerHandle:
        assert self._loop is not None
        return self._loop.call_later(delay, fn, *args)

    def _poke_completer(self) -> None:
        ev = self._completer_wait
        if ev is not None:
            ev.set()

    async def _interrupted(self, job: _Job, reason: str) -> None:
        if reason == "lease lost":
            self.lost += 1
            log.warning("job %s (%s): lease lost (reclaimed elsewhere); its outcome is dropped", job.id, job.kind)
        elif reason == "shutdown":
            await self._release(job, None)
        elif reason == "cancel requested":
            await self._ack_cancel(job)
        else:  # timeout
            timeout = job.handler.timeout
            await self._fail(job, f"TimeoutError: the job ran longer than its timeout of {timeout:g} s", None)

    async def _failed(self, job: _Job, error: BaseException) -> None:
        if isinstance(error, Retry):
            retry_at = None if error.after is None else when_to_datetime(error.after)
            await self._fail(job, str(error), retry_at)
        elif isinstance(error, Snooze):
            await self._release(job, when_to_datetime(error.until))
        elif job.ctx is not None and job.ctx.cancelled.is_set() and job.ctx.cancelled.reason == "cancel requested":
            await self._ack_cancel(job)
        else:
            text = "".join(traceback.format_exception(error)).rstrip()
            log.warning("job %s (%s) attempt %s failed: %r", job.id, job.kind, job.attempt, error)
            await self._fail(job, text, job.handler.retry_at(job.attempt))

    # ------------------------------------------------------------------------------------------ per-job calls

    async def _call(self, query: LiteralString, params: Sequence[Any]) -> Any:
        """One round trip on the pool; connection errors are retried with backoff (every call is a lease-token
        CAS, so a replay after a lost reply changes nothing); gives up after ~30 s."""
        failures = 0
        while True:
            assert self._pool is not None
            try:
                async with self._pool.connection() as conn:
                    cur = await conn.execute(query, params)
                    row = await cur.fetchone()
                    return None if row is None else row[0]
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                failures += 1
                self._cut_off_at = anyio.current_time()
                if failures > 8:
                    raise
                await self._check_pool()
                delay = backoff_delay(failures, 0.1, 5.0)
                log.warning("database call failed (%s); retrying in %.2f s", exc, delay)
                await anyio.sleep(delay)
            except psycopg.Error as exc:
                raise translate(exc) from exc

    async def _check_pool(self) -> None:
        """After a connection error: drop every broken idle connection of the pool at once. A server restart
        breaks them all, and without this each one would fail one more call (a renewal, a report) in turn."""
        pool = self._pool
        if pool is None:
            return
        with anyio.move_on_after(5.0), contextlib.suppress(Exception):
            await pool.check()

    async def _report(self, job: _Job, query: LiteralString, params: Sequence[Any]) -> Any:
        """A job's final call: shielded (a shutdown must not cut it), errors logged, never raised."""
        with anyio.CancelScope(shield=True):
            try:
                return await self._call(query, params)
            except Exception as exc:
                log.error("job %s (%s): reporting its outcome failed: %s", job.id, job.kind, exc)
                return None

    async def _fail(self, job: _Job, error: str, retry_at: datetime | None) -> None:
        state = await self._report(
            job,
            "SELECT pgjobs.fail(id => %s, lease_token => %s::uuid, error => %s, retry_at => %s)::text",
            (job.id, job.token, error, retry_at),
        )
        self.failed += 1
        if state == "scheduled":
            self._poke_poller()

    async def _release(self, job: _Job, run_at: datetime | None) -> None:
        ok = await self._report(
            job, "SELECT pgjobs.release(id => %s, lease_token => %s::uuid, run_at => %s)", (job.id, job.token, run_at)
        )
        if ok:
            self.released += 1
        if run_at is not None:
            self._poke_poller()

    async def _ack_cancel(self, job: _Job) -> None:
        ok = await self._report(job, "SELECT pgjobs.ack_cancel(id => %s, lease_token => %s::uuid)", (job.id, job.token))
        if ok:
            self.cancelled += 1

    async def _ctx_call(self, op: str, ctx: JobContext | SyncJobContext, arg: Any) -> Any:
        """What ``ctx.save_checkpoint`` / ``report_progress`` / ``add_to_batch`` run (on the event loop)."""
        if op == "checkpoint":
            return await self._call(
                "SELECT pgjobs.checkpoint(id => %s, lease_token => %s::uuid, checkpoint => %s)",
                (ctx.id, ctx.lease_token, Jsonb(arg)),
            )
        if op == "progress":
            return await self._call(
                "SELECT pgjobs.progress(id => %s, lease_token => %s::uuid, progress => %s)",
                (ctx.id, ctx.lease_token, Jsonb(arg)),
            )
        if op == "add_to_batch":
            spec, before = arg
            return await self._call(
                "SELECT pgjobs.add_to_batch(id => %s, lease_token => %s::uuid, job => %s, before_continuations => %s)",
                (ctx.id, ctx.lease_token, Jsonb(spec), before),
            )
        raise ValueError(f"unknown context call {op!r}")

    # ------------------------------------------------------------------------------------------ completer

    async def _completer(self) -> None:
        conn: psycopg.AsyncConnection[Any] | None = None
        cur: psycopg.AsyncCursor[Any] = None  # type: ignore[assignment]  # set with conn
        failures = 0
        try:
            while True:
                if not self._done:
                    if self._stopping and not self._jobs:
                        return
                    self._completer_wait = anyio.Event()
                    with anyio.move_on_after(0.5 if self._stopping else math.inf):
                        await self._completer_wait.wait()
                    self._completer_wait = None
                    continue
                batch, self._done = self._done, []
                self._in_flight = batch
                ids = "{" + ",".join([str(b[0]) for b in batch]) + "}"
                tokens = "{" + ",".join([b[1] for b in batch]) + "}"
                results = [b[2] for b in batch]
                query: LiteralString = _COMPLETE_SQL
                params: tuple[str, ...] = (ids, tokens)
                if any(r is not None for r in results):
                    query = _COMPLETE_RESULTS_SQL
                    params = (ids, tokens, "[" + ",".join([r or "null" for r in results]) + "]")
                while True:
                    try:
                        if conn is None or conn.closed:
                            conn = await self._connect(
                                "complete", _SESSION_OPTIONS if self.durable_completions else _CLAIM_OPTIONS
                            )
                            cur = conn.cursor()
                        with anyio.CancelScope(shield=True):
                            await cur.execute(query, params, prepare=True)
                            row = await cur.fetchone()
                        done = int(row[0]) if row else 0
                        self.complete_calls += 1
                        self.completed += done
                        if done < len(batch):
                            self.lost += len(batch) - done
                        failures = 0
                        break
                    except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                        failures += 1
                        self._cut_off_at = anyio.current_time()
                        delay = backoff_delay(failures, 0.05, _RECONNECT_CAP)
                        log.warning(
                            "complete_many of %d job(s) failed (%s); retrying in %.2f s", len(batch), exc, delay
                        )
                        if conn is not None:
                            await conn.close()
                            conn = None
                        if self._stopping and failures >= 5:
                            # A stopping worker does not wait forever for the database: these jobs stay leased
                            # and run again elsewhere once their leases expire (at least once, not lost).
                            log.error("giving up on completing %d job(s) while stopping: %s", len(batch), exc)
                            break
                        await self._backoff(delay)
                    except psycopg.Error as exc:
                        raise translate(exc) from exc
                self._in_flight = []
        finally:
            if conn is not None:
                with anyio.CancelScope(shield=True):
                    await conn.close()

    # ------------------------------------------------------------------------------------------ background

    def _poke_poller(self) -> None:
        if self._poller_wait is not None:
            self._poller_wait.set()

    async def _poller(self) -> None:
        names = list(self.queues)
        while True:
            delay = self.poll_interval
            try:
                due_in = await self._call(_NEXT_DUE_SQL, (names,))
            except Exception as exc:
                log.warning("next_due_at failed: %s", exc)
                due_in = None
            if due_in is not None and due_in > 0:
                delay = min(delay, due_in + 0.002)
            self._poller_wait = anyio.Event()
            with anyio.move_on_after(delay) as scope:
                await self._poller_wait.wait()
            self._poller_wait = None
            if scope.cancelled_caught:
                self._wake_all()

    async def _renewer(self) -> None:
        interval = self.lease / 3
        failures = 0
        while True:
            # After a failed renewal (the database restarting) try again soon rather than a third of a lease
            # later: the leases ran on while the server was away, and a claimer elsewhere may take them.
            if failures:
                await self._backoff(min(interval, backoff_delay(failures, 0.05, 1.0)))
            else:
                await anyio.sleep(interval)
            failures = 0 if await self._renew_held() else failures + 1

    async def _renew_held(self, conn: psycopg.AsyncConnection[Any] | None = None) -> bool:
        """One ``renew_leases`` for every job this worker holds (on ``conn``, else a pooled connection); False
        when the database could not be reached. Jobs whose outcome is being reported (FINISHING, or waiting in
        the completer) are renewed too: a report that retries through an outage must not let the lease lapse
        and the job run again."""
        held = list(self._jobs.values())
        pending = list(self._in_flight) + list(self._done)
        if not held and not pending:
            return True
        ids = [j.id for j in held] + [p[0] for p in pending]
        tokens = [j.token for j in held] + [p[1] for p in pending]
        try:
            if conn is not None:
                rows = await (await conn.execute(_RENEW_SQL, (ids, tokens, self._lease_td))).fetchall()
            else:
                assert self._pool is not None
                async with self._pool.connection() as pooled:
                    rows = await (await pooled.execute(_RENEW_SQL, (ids, tokens, self._lease_td))).fetchall()
        except psycopg.Error as exc:
            log.warning("lease renewal of %d job(s) failed: %s", len(ids), exc)
            if conn is None and isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
                self._cut_off_at = anyio.current_time()
                await self._check_pool()
            return False
        still = {r[0]: r[1] for r in rows}
        for job in held:
            if job.id not in still:
                # Reclaimed elsewhere (or settled): this attempt's outcome no longer counts.
                if self._jobs.get(job.id) is job and job.phase == _RUNNING:
                    job.interrupt("lease lost")
            elif still[job.id] and job.ctx is not None:
                job.ctx.cancelled.set("cancel requested")
        return True

    def _meta(self) -> dict[str, Any]:
        return {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "queues": self.queues,
            "concurrency": sum(self.queues.values()),
            "active": self.active,
            "kinds": self.app.kinds,
        }

    async def _heartbeat_once(self) -> None:
        await self._call("SELECT pgjobs.worker_heartbeat(worker => %s, meta => %s)", (self.name, Jsonb(self._meta())))

    async def _heartbeat(self) -> None:
        stale_after = timedelta(seconds=self.reap_after)
        while True:
            await anyio.sleep(self.heartbeat_interval)
            try:
                await self._heartbeat_once()
            except Exception as exc:
                log.warning("heartbeat failed: %s", exc)
                continue
            cut_off_at = self._cut_off_at
            if cut_off_at is not None and anyio.current_time() - cut_off_at < self.reap_after:
                # We could not reach the database a moment ago: nor could the others, probably, and their
                # heartbeats are as stale as ours was. Reaping now would take running jobs from live workers.
                continue
            try:
                reaped = await self._call(_REAP_SQL, (stale_after, stale_after))
            except Exception as exc:
                log.warning("reap_workers failed: %s", exc)
                continue
            if reaped:
                log.info("reaped %d silent worker(s); their jobs are claimable now", reaped)
                self._wake_all()

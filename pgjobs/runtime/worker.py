"""The worker runtime: claims jobs, runs their handlers, reports the outcome.

One process, one anyio task group (asyncio: psycopg's async connections need it). :class:`Worker` holds the
options and wires the parts, each in its own module over the shared :class:`~pgjobs.runtime.state.WorkerState`:

* :mod:`~pgjobs.runtime.claimer`: per served queue, a claim loop on its own connection, and the dispatch of
  the claimed jobs (with their parents' results, for kinds that asked);
* :mod:`~pgjobs.runtime.runner`: per queue, ``capacity`` long-lived slot tasks that run the handlers, and the
  mapping of how a handler ended to the job's outcome;
* :mod:`~pgjobs.runtime.completer`: the batched ``complete_many`` on its own connection, and the one-job
  reports (``fail``, ``release``, ``ack_cancel``);
* :mod:`~pgjobs.runtime.leases`: the lease renewer, the heartbeat and the reaping of silent workers;
* :mod:`~pgjobs.runtime.listener`: the LISTEN loop's wake and cancel handling, and the poll fallback;
* the recurring-jobs scheduler (:mod:`pgjobs.runtime.scheduler`), when ``scheduler=True``.

The same job claimed again by this worker (its lease ran out during an outage while the handler ran or its outcome
waited for the database) replaces the older attempt, which is interrupted as "lease lost".

The SQL of every call lives in :mod:`pgjobs.client` (the hot-path statements beside the ``Call`` builders of
their concern); handlers reach the database through the worker as their
:class:`~pgjobs.runtime.context.JobRuntime`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Mapping, Sequence
from datetime import timedelta
from functools import partial
from types import TracebackType
from typing import Any, Self

import anyio
from anyio.abc import TaskGroup
from psycopg_pool import AsyncConnectionPool

from pgjobs.runtime import claimer, leases, listener, runner, telemetry, vacuum
from pgjobs.runtime.app import App
from pgjobs.runtime.completer import Completer
from pgjobs.runtime.listener import CANCEL_CHANNEL, WAKE_CHANNEL
from pgjobs.runtime.scheduler import Scheduler
from pgjobs.runtime.state import (
    POOL_RECONNECT,
    POOL_WAIT,
    QUEUED,
    SESSION_OPTIONS,
    WorkerState,
    WorkerStats,
    default_worker_name,
    seconds,
)

__all__ = ["CANCEL_CHANNEL", "WAKE_CHANNEL", "Worker", "WorkerStats", "default_worker_name"]

log = logging.getLogger("pgjobs.worker")


class Worker(WorkerState):
    """Runs an :class:`~pgjobs.App`'s handlers for jobs of the ``queues`` it serves.

    ``queues``: ``{"default": 10, "emails": 5}`` (queue -> how many jobs it runs at once), or a list of names
    that each get ``concurrency``. ``lease``: seconds a claim holds a job before another worker may take it
    (renewed every lease/3 while the handler runs). ``grace_period``: on stop, how long running jobs may
    finish before they are released. ``poll_interval``: the fallback beat when no notification comes.
    ``heartbeat_interval``: ``worker_heartbeat`` + ``reap_workers(reap_after)`` (default 6 heartbeats).
    ``scheduler``: also run the recurring-jobs scheduler (:mod:`pgjobs.runtime.scheduler`).
    ``durable_completions=False`` commits completions without waiting for the WAL flush (``synchronous_commit
    = off`` on the completer's connection): faster, above all with status events on (a notifying commit holds
    a cluster-wide lock through its flush), but a *server* crash can forget the last fraction of a second of
    completions; those jobs then run again when their leases expire (at least once, as after a worker crash),
    and a subscriber may have seen them succeed. Failures, releases and cancels are always durable.
    ``vacuum``: VACUUM the hot tables from the worker when autovacuum will not (autovacuum off, off for the table,
    or far behind; sql/vacuum.sql), every heartbeat at most, on a connection of its own; needs a login role
    that may vacuum them (the owner). ``vacuum=False`` leaves it to autovacuum or ``pgjobs maintain``.

    Operations (README "Operations"): ``metrics_port`` serves Prometheus metrics on ``metrics_host``
    (``pgjobs.runtime.metrics``; 0 picks a free port, see ``worker.metrics.port``). ``tracing``: a span per
    attempt (extra ``pgjobs-queue[otel]``; None: on when a tracer provider is set). ``listen_dsn``: LISTEN
    on a direct connection when ``dsn`` goes through PgBouncer in transaction mode. A pooler that cannot keep
    prepared statements nor startup options is found by the first connection's probe (a startup option that
    must come back), else by the error it gives (one log line, then none of either); ``prepare=False`` turns
    both off from the start. ``claims_by_trigger`` / ``claimed_by_trigger``:
    the claim calls and the jobs they took, by what started them (``poll``, ``wake``, ``ended`` ...:
    docs/cap-wakes.md).
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
        vacuum: bool = True,
        prepare: bool = True,
        listen_dsn: str | None = None,
        metrics_port: int | None = None,
        metrics_host: str = "127.0.0.1",
        tracing: bool | None = None,
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
        self.lease = seconds(lease)
        self.grace_period = seconds(grace_period)
        self.poll_interval = seconds(poll_interval)
        self.heartbeat_interval = seconds(heartbeat_interval)
        self.reap_after = seconds(reap_after) if reap_after is not None else 6 * self.heartbeat_interval
        for label, value in (("lease", self.lease), ("poll_interval", self.poll_interval),
                             ("heartbeat_interval", self.heartbeat_interval)):  # fmt: skip
            if value <= 0:
                raise ValueError(f"{label} must be positive, got {value}")
        if self.grace_period < 0:
            raise ValueError(f"grace_period must be >= 0, got {self.grace_period}")
        if metrics_port is not None and not 0 <= metrics_port <= 65535:
            raise ValueError(f"metrics_port must be 0-65535 (0: any free port), got {metrics_port}")
        self.name = name or default_worker_name()
        self.scheduler = scheduler
        self.pool_size = pool_size
        self.durable_completions = durable_completions
        self.vacuum = vacuum
        self.prepare = prepare
        self.listen_dsn = listen_dsn
        self.metrics_port = metrics_port
        self.metrics_host = metrics_host
        self.tracing = tracing

        self.claimers = claimers
        self._exit_stack: contextlib.AsyncExitStack | None = None  # async with Worker(...)
        self._stop_event: anyio.Event | None = None  # set by stop(): the drain begins
        self.stop_signal: int | None = None  # the first SIGINT/SIGTERM run_sync received
        self.init_state()

    # ------------------------------------------------------------------------------------------ control

    def stop(self, graceful: bool = True) -> None:
        """Asks the worker to stop: no more claims, running jobs get ``grace_period`` to finish (none when
        ``graceful`` is False), the rest are released. Safe from any thread and from signal handlers."""
        self.stopping = True
        if not graceful:
            self.hard_stop = True
        loop = self.loop
        if loop is None or loop.is_closed():
            return
        # Always through the loop's queue: stop() may run in another thread or in a signal handler that
        # interrupted the loop's own code, where touching its state directly is not safe.
        with contextlib.suppress(RuntimeError):  # loop closing
            loop.call_soon_threadsafe(self._on_stop)

    def _on_stop(self) -> None:
        if self._stop_event is not None:
            if not self._stop_event.is_set():
                telemetry.stop_requested(self)
            self._stop_event.set()
        self.retry_now()
        for q in self.queue_states:
            q.poke("any")

    def run_sync(self) -> int:
        """Runs the worker until SIGINT/SIGTERM (graceful stop; a second signal releases at once). Returns 0;
        ``stop_signal`` then holds the signal that stopped it (the command line exits 128 + its number)."""
        installed: dict[signal.Signals, Any] = {}

        def on_signal(signum: int, frame: Any) -> None:
            if self.stop_signal is None:
                self.stop_signal = signum
            if self.stopping:
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

    async def __aenter__(self) -> Self:
        """``async with Worker(...) as worker:`` runs the worker in the background for the block (``run()`` in
        a task group of its own) and stops it gracefully when the block ends, waiting for the stop. The block
        does not wait for the start: ``worker.started`` (a :class:`threading.Event`) is set once the worker
        has connected and claims."""
        stack = contextlib.AsyncExitStack()
        tg = await stack.enter_async_context(anyio.create_task_group())
        tg.start_soon(self.run)
        self._exit_stack = stack
        return self

    async def __aexit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        stack, self._exit_stack = self._exit_stack, None
        self.stop()
        if stack is not None:
            await stack.__aexit__(t, e, tb)

    @property
    def stats(self) -> WorkerStats:
        return WorkerStats(self.claimed, self.completed, self.failed, self.released, self.cancelled, self.lost)

    # ------------------------------------------------------------------------------------------ run

    def _new_pool(self) -> AsyncConnectionPool[Any]:
        return AsyncConnectionPool(
            self.dsn,
            min_size=1,
            max_size=max(2, self.pool_size),
            kwargs={
                "autocommit": True,
                "application_name": f"pgjobs-worker:{self.name}",
                **self.conn_kwargs(SESSION_OPTIONS),
            },
            open=False,
            name=f"pgjobs-worker-{self.name}",
            # After a long outage psycopg_pool's own reconnect backoff (doubling up to reconnect_timeout, 5 min
            # by default) left the pool empty for ~30 s after the server was back, and every call waited out
            # the 30 s default timeout. Short attempts that give up and start again on demand, and a short
            # wait that call() retries, bring pooled calls back within a second or two of the server.
            timeout=POOL_WAIT,
            reconnect_timeout=POOL_RECONNECT,
        )

    async def run(self) -> None:
        """Runs until :meth:`stop`; raises on fatal errors (schema missing, database unreachable at start)."""
        self.loop = asyncio.get_running_loop()
        self._stop_event = anyio.Event()
        if self.stopping:
            self._stop_event.set()
        self.limiter = anyio.CapacityLimiter(max(1, sum(self.queues.values())))
        self.wants_parents = any(h.parent_results for h in self.app.handlers.values())
        pool = self._new_pool()
        self.pool = pool
        started_at = anyio.current_time()
        telemetry.start(self)
        try:
            # One direct connect first: an unreachable server fails with its own clear error, not a pool timeout.
            await self.probe()
            await pool.open(wait=True, timeout=15)
            await leases.heartbeat_once(self)  # fails fast on a missing schema or an unreachable database
            await listener.read_caps(self)
            async with anyio.create_task_group() as services:
                self.listener = listener.make_listener(self)
                await services.start(self.listener.run, partial(listener.on_notify, self))
                services.start_soon(listener.poller, self)
                services.start_soon(leases.renewer, self)
                services.start_soon(leases.heartbeat, self)
                services.start_soon(listener.caps_reader, self)
                if self.vacuum:
                    services.start_soon(vacuum.vacuumer, self)
                await self._start_scheduler(services)
                await self._work()
                services.cancel_scope.cancel()
            # the heartbeat has stopped (it would register the worker again): now say we are gone
            await leases.deregister(self)
            telemetry.stopped(self, anyio.current_time() - started_at)
        finally:
            with anyio.CancelScope(shield=True):
                await pool.close()
            self.pool = None
            telemetry.close(self)

    async def _work(self) -> None:
        """The completer, the slots and the claimers, until stop() and the drain."""
        assert self._stop_event is not None
        async with anyio.create_task_group() as work:
            work.start_soon(Completer(self).run)
            async with anyio.create_task_group() as jobs:
                for q in self.queue_states:
                    for _ in range(q.capacity):
                        jobs.start_soon(runner.slot, self, q)
                    for _ in range(self.claimers_for(q.capacity)):
                        jobs.start_soon(claimer.claim_loop, self, q)
                self.started.set()
                await self._stop_event.wait()
                await self._drain(jobs)
            # every slot ended: flush the last completions, then stop the completer
            if self.jobs:
                log.warning("%d job(s) could not be released; their leases will expire", len(self.jobs))
                self.jobs.clear()
            self.poke_completer()

    async def _start_scheduler(self, tg: TaskGroup) -> None:
        """The recurring-jobs scheduler (pgjobs/runtime/scheduler.py), started in the worker's task group when
        ``scheduler=True``."""
        if not self.scheduler:
            return
        sched = Scheduler(
            self.app,
            self.dsn,
            pool=self.pool,
            name=self.name,
            listen_dsn=self.listen_dsn,
            outage=self.outage,
            prepare=self.prepare,
        )
        await tg.start(sched.run)

    async def _drain(self, jobs: TaskGroup) -> None:
        """Graceful end: claimers stop (they see stopping), running jobs get the grace period, the rest are
        released; then the slots exit."""
        self.stopping = True
        for q in self.queue_states:
            q.poke("any")
        deadline = anyio.current_time() + (0.0 if self.hard_stop else self.grace_period)
        while self.jobs and anyio.current_time() < deadline and not self.hard_stop:
            await anyio.sleep(min(0.05, max(0.0, deadline - anyio.current_time())))
        if self.jobs:
            log.info(
                "grace period over: releasing %d running job(s)", len(self.jobs),
                extra={"event": "worker.releasing", "jobs": len(self.jobs)},
            )  # fmt: skip
            for job in list(self.jobs.values()):
                if job.phase == QUEUED:
                    job.stop_reason = "shutdown"
                job.interrupt("shutdown")
            before = self.released
            # releases take one round trip each; bounded so a dead database cannot hold the exit
            with anyio.move_on_after(max(5.0, self.lease / 3)):
                while self.jobs or self.active:
                    await anyio.sleep(0.01)
            log.info(
                "released %d job(s)", self.released - before,
                extra={"event": "worker.released", "jobs": self.released - before},
            )  # fmt: skip
        for q in self.queue_states:
            for ev in q.parked:
                ev.set()
            q.parked.clear()
        if self.jobs or self.active:
            jobs.cancel_scope.cancel()

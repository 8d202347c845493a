"""What the worker's parts share: the jobs it holds, its queues, its connections, its counters.

:class:`WorkerState` is the base of :class:`pgjobs.runtime.worker.Worker`; the parts (``claimer``,
``runner``, ``completer``, ``leases``, ``listener``) are functions over it, each in its own module, so each
part reads the state the others write without importing them back. What they share is public and declared on
the class with its type; a name with a leading underscore stays in the module that defines it
(tests/test_layout.py checks it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import socket
import threading
import uuid
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import anyio
import psycopg
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from pgjobs.client._call import Call, run_on
from pgjobs.client.graph import add_to_batch_call
from pgjobs.client.lifecycle import checkpoint_call, progress_call
from pgjobs.client.listen import Listener, backoff_delay
from pgjobs.client.pooler import (
    PREPARED_LOST,
    PROBE_QUERY,
    SessionNotKept,
    announce,
    probe_conninfo,
    refused_options,
    verdict,
)
from pgjobs.errors import translate
from pgjobs.runtime.app import App, JobHandler
from pgjobs.runtime.context import JobContext, SyncJobContext
from pgjobs.runtime.logs import Outage
from pgjobs.runtime.metrics import WorkerMetrics
from pgjobs.runtime.tracing import Tracer

log = logging.getLogger("pgjobs.worker")

T = TypeVar("T")

# Every worker connection runs with jit off: the hot functions run generic plans whose cost estimates grow with
# the table, and past jit_above_cost (about 30,000 pending jobs) each claim spent ~27 ms compiling its plan
# for a statement that runs in under 1 ms.
SESSION_OPTIONS = "-c jit=off"
# Reconnect backoff ceiling (before jitter) of the claim, completion and LISTEN connections. Retrying a dead
# server every ~2 s costs nothing, and bounds how long a worker idles after the server is back.
RECONNECT_CAP = 2.0
# The worker's pool: how long a call waits for a connection (PoolTimeout is retried by call()), and how long the
# pool retries a failed connect before giving up on it (the next call that needs one tries again, at once).
POOL_WAIT = 5.0
# How long one pooled round trip may hold off a cancellation (WorkerState.call): the pool's wait plus a margin
# for the statement; a bound for a database that stopped answering, never reached by a healthy one.
CALL_SHIELD = 30.0
POOL_RECONNECT = 3.0
# A claim needs no durable commit: if the server crashes before the claim's WAL reaches disk, the job simply
# comes back unclaimed (attempt not counted), and this worker's later calls for it fail the token compare-and-set
# (no-ops). Skipping the flush wait takes ~0.5 ms off every claim, i.e. off the wake-up latency.
CLAIM_OPTIONS = SESSION_OPTIONS + " -c synchronous_commit=off"

# SQLSTATEs of a statement that lost a race and only has to run again: 40001 serialization_failure (with jobs
# partitioned by state, a row the statement waited for, or was about to lock, was moved to another partition by
# an end that committed: PostgreSQL cannot re-check the row there) and 40P01 deadlock_detected. Every worker
# connection is autocommit, so the failed statement changed nothing, and every worker call is a lease-token
# compare-and-set or idempotent: running it again is safe. Not a crash, not a lost job: a retry.
# (psycopg makes both OperationalError subclasses, like a lost connection: they are caught first, or a lost race
# would be taken for an outage, its connection closed and the reaping held off.)
TRANSIENT_SQLSTATES = frozenset({"40001", "40P01"})
TRANSIENT_ERRORS = (psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected)
# Attempts at a statement that keeps failing so before the error is raised (~5 s of backoff in all).
TRANSIENT_TRIES = 12


def _call_name(query: str) -> str:
    """``pgjobs.fail`` for a call's ``SELECT pgjobs.fail(...)`` (for the logs)."""
    m = re.search(r"pgjobs\.(\w+)", query)
    return f"pgjobs.{m.group(1)}" if m else "database call"


def transient_delay(failures: int) -> float:
    """The pause before running again a statement that lost a race ``failures`` times in a row."""
    return backoff_delay(failures, 0.01, 1.0)


# A job's phases, for the renewer and the shutdown: only a RUNNING handler can be cancelled.
QUEUED, RUNNING, FINISHING = 0, 1, 2

# A finished job awaiting complete_many: (id, lease token, result as JSON text or None, its queue).
Done = tuple[int, str, str | None, "QueueState"]


class HeldJob:
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
        "span",
        "started",
        "stop_reason",
        "token",
    )

    def __init__(self, row: tuple[Any, ...], handler: JobHandler, queue: QueueState) -> None:
        (self.id, self.kind, _q, self.payload, self.attempt, self.max_attempts, self.token, self.checkpoint,
         self.batch_id, self.meta) = row  # fmt: skip
        self.handler = handler
        self.queue = queue
        self.phase = QUEUED
        self.scope: anyio.CancelScope | None = None
        self.stop_reason: str | None = None  # why the worker cancelled the handler: timeout/lease/shutdown
        self.ctx: JobContext | SyncJobContext | None = None
        self.parents: str | None = None  # the parents' results (JSON text), for kinds that asked
        self.started: float | None = None  # perf_counter() when its handler started
        self.span: Any = None  # its attempt's span, when tracing is on

    def cancel_requested(self) -> None:
        """Its cancellation was requested (as read from SQL, never from a notification alone): an async
        handler is cancelled now; a sync one, whose thread cannot be killed, sees ``ctx.cancelled``. Either
        way the attempt ends ``cancelled`` (``ack_cancel``)."""
        if self.ctx is None:  # not started yet: the slot sets the flag before the handler runs
            self.stop_reason = self.stop_reason or "cancel requested"
        elif self.handler.is_async:
            self.interrupt("cancel requested")
        else:
            self.ctx.cancelled.set("cancel requested")

    def interrupt(self, reason: str) -> None:
        """Cancels the running handler (first reason wins) and tells it through ctx.cancelled."""
        if self.stop_reason is None:
            self.stop_reason = reason
        if self.ctx is not None:
            self.ctx.cancelled.set(reason)
        if self.scope is not None and self.phase == RUNNING:
            self.scope.cancel()


class QueueState:
    """Per served queue: capacity, the claimers' wake state, the ready jobs and the parked slots."""

    __slots__ = (
        "capacity", "capped", "chunk", "more", "name", "parked", "ready", "reserved", "running", "waiters", "why",
    )  # fmt: skip

    def __init__(self, name: str, capacity: int, claimers: int) -> None:
        self.name = name
        self.capacity = capacity
        self.chunk = -(-capacity // claimers)  # what one claim asks for at most
        self.running = 0  # claimed and not yet ended (queued in `ready` or running in a slot)
        self.reserved = 0  # asked for by claims in flight: never more than capacity - running in all
        self.more = True  # something may be claimable: claim when capacity allows
        self.why = "start"  # what set `more` first since the last claim (WorkerState.claims_by_trigger)
        self.capped = False  # max_active or max_active_per_group is set (pgjobs.capped_queues; claimer.read_caps)
        self.waiters: dict[anyio.Event, str] = {}  # sleeping claimers -> what they wait for ("wake" | "slot")
        self.ready: deque[HeldJob] = deque()
        self.parked: list[anyio.Event] = []

    def mark(self, why: str) -> None:
        """Something may be claimable: claim when capacity allows. ``why`` says what said so (the first since
        the last claim is the trigger that claim is counted under)."""
        if not self.more:
            self.more = True
            self.why = why

    def wake(self, why: str) -> None:
        """:meth:`mark`, and the claimers that sleep until a wake claim now."""
        self.mark(why)
        self.poke("wake")

    def ended(self) -> None:
        """The end of one of its jobs has committed (or the job left this worker): under a cap that end made
        room, so the claimers claim again now. A claim the cap cut short otherwise sleeps until a wake, and
        the worker's own completion would wake it only through the LISTEN connection (sql/wakeups.sql,
        _wake_capped)."""
        if self.capped:
            self.wake("ended")

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


def default_worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def seconds(value: float | timedelta) -> float:
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


class WorkerState:
    """The state every part of a worker reads and writes, and the helpers they share (connections, the
    pooled call with retries, the backoff pause, the wake-ups). Set up by :meth:`init_state`."""

    app: App
    dsn: str
    name: str
    queues: dict[str, int]
    lease: float
    poll_interval: float
    heartbeat_interval: float
    reap_after: float
    durable_completions: bool
    vacuum: bool  # the hot tables vacuumed from this worker when autovacuum will not (runtime/vacuum.py)
    claimers: int | None
    grace_period: float
    prepare: bool  # False: no server-side prepared statements and no startup options (PgBouncer)
    listen_dsn: str | None  # where LISTEN goes (None: dsn)
    metrics_port: int | None
    metrics_host: str
    tracing: bool | None

    # What the parts share (set by init_state; the Worker sets the run's loop, pool and limiter in run()).
    queue_states: list[QueueState]  # one per served queue, in the order of ``queues``
    queue_by_name: dict[str, QueueState]
    jobs: dict[int, HeldJob]  # the jobs this worker holds, by id
    done: list[Done]  # ended jobs awaiting complete_many
    in_flight: list[Done]  # in the complete_many call now
    spans: dict[int, Any]  # attempt spans of jobs awaiting complete_many (tracing only)
    completer_wait: anyio.Event | None  # set to send the completions now (poke_completer)
    poller_wait: anyio.Event | None  # set to end the poller's sleep now (poke_poller)
    rate_limited: bool  # a rate limit may hold back jobs of the served queues (listener.read_caps)
    renewer_wait: anyio.Event | None  # set to renew the leases now: a cancel hint came (poke_renewer)
    renew_busy: bool  # the last renewal found held jobs busy (not renewed): renew again soon
    stopping: bool  # stop() was called: no more claims
    hard_stop: bool  # stop(graceful=False): no grace period
    loop: asyncio.AbstractEventLoop | None  # the loop run() runs on
    pool: AsyncConnectionPool[Any] | None  # the pool of call(), open while run() runs
    limiter: anyio.CapacityLimiter | None  # the threads of sync handlers
    lease_td: timedelta  # ``lease`` as an interval, for the lease calls
    limits_cache: dict[int, str]  # claim's per-kind limits (JSON) by free capacity (claimer)
    wants_parents: bool  # any handler with parent_results=True (set when run() starts)
    cut_off_at: float | None  # anyio time of this worker's last failure to reach the database

    def init_state(self) -> None:
        self.queue_states = [QueueState(q, n, self.claimers_for(n)) for q, n in self.queues.items()]
        self.queue_by_name = {q.name: q for q in self.queue_states}
        self.jobs = {}
        self.done = []
        self.in_flight = []
        self.completer_wait = None
        self._backoff_wait: anyio.Event | None = None  # set when connection retries should not wait any longer
        self.poller_wait = None
        self.rate_limited = False
        self.renewer_wait = None
        self.renew_busy = False
        self.stopping = False
        self.hard_stop = False
        self.loop = None
        self.pool = None
        self.limiter = None
        self.lease_td = timedelta(seconds=self.lease)
        self.limits_cache = {}
        self.wants_parents = False
        self.listener: Listener | None = None
        self.cut_off_at = None
        self.started = threading.Event()  # set once connected, its claimers and slots running (public: README)
        self.claimed = self.completed = self.failed = self.released = self.cancelled = self.lost = 0
        self.claim_calls = self.complete_calls = 0
        # claim calls, and the jobs they returned, by what started them (QueueState.mark): "start", "full" (the
        # last claim came back full), "wake" (pgjobs_wake), "ended" (a capped queue's job ended here), "poll",
        # "listen" (LISTEN (re)connected), "reaped", "retry" (after a lost race or an outage)
        self.claims_by_trigger: Counter[str] = Counter()
        self.claimed_by_trigger: Counter[str] = Counter()
        self.transient_retries = 0  # statements run again after a 40001/40P01 (see TRANSIENT_SQLSTATES)
        # telemetry: None when off, so the hot path pays one `is None` test (set up by Worker.run)
        self.metrics: WorkerMetrics | None = None
        self.tracer: Tracer | None = None
        self.spans = {}
        self.outage = Outage(log)
        self.heartbeats = 0  # heartbeats sent by the loop (runtime/unhandled.py checks every few)
        self.unhandled_seen: set[tuple[str, str]] = set()  # (queue, kind) pairs already reported as unhandled

    def claimers_for(self, capacity: int) -> int:
        """Claim connections per queue (``claimers``, default 1). Measured: two concurrent claims of half the
        capacity each halve the throughput of no-op jobs (each claim skips the rows the other locked, and the
        fixed cost of a claim is paid twice as often), so one claimer asking for all free capacity it is."""
        return 1 if self.claimers is None else max(1, min(self.claimers, capacity))

    @property
    def active(self) -> int:
        return sum(q.running for q in self.queue_states)

    # ------------------------------------------------------------------------------------------ connections

    def conn_kwargs(self, options: str | None) -> dict[str, Any]:
        """Connection options. Without ``prepare`` (PgBouncer in transaction mode): no startup ``options``
        (PgBouncer refuses the parameter: set jit = off on the role instead) and none of psycopg's automatic
        prepared statements (a statement prepared on one server connection is missing on the next)."""
        if not self.prepare:
            return {"prepare_threshold": None}
        return {} if options is None else {"options": options}

    def unprepare(self, exc: psycopg.Error | SessionNotKept) -> None:
        """A pooler that cannot keep prepared statements nor startup options is in front (client/pooler.py):
        none from now on, on new connections and in every statement; the caller runs its statement again (it did
        not run). Raises ``exc`` (translated) when they were off already: then it is no pooler's doing."""
        if not self.prepare:
            if isinstance(exc, SessionNotKept):
                return
            raise translate(exc) from exc
        self.prepare = False
        listen = "" if self.listen_dsn else " (LISTEN goes through it too: give listen_dsn / --listen-dsn)"
        announce(f"pgjobs worker {self.name}{listen}", exc)
        kwargs = self.pool.kwargs if self.pool is not None else None
        if isinstance(kwargs, dict):  # the connections the pool opens from now on
            kwargs.pop("options", None)
            kwargs["prepare_threshold"] = None

    async def probe(self) -> None:
        """The first connection, with the startup options the worker's connections carry: an unreachable server
        fails here with its own clear error, and a pooler that refuses the options (PgBouncer) is found before
        any other connection is made. With ``prepare``, the options also carry a fresh value of
        ``pgjobs.probe`` that must come back: a pooler that drops them (``ignore_startup_parameters = options``)
        is found here too, before anything is prepared (client/pooler.py)."""
        if self.prepare:
            conninfo, nonce = probe_conninfo(self.dsn, SESSION_OPTIONS)
            try:
                conn = await self.connect("probe", dsn=conninfo)
            except psycopg.OperationalError as exc:
                if not refused_options(exc):
                    raise
                self.unprepare(exc)
            else:
                cur = await conn.execute(PROBE_QUERY, prepare=False)
                finding = verdict(await cur.fetchone(), nonce)
                await conn.close()
                if finding is not None:
                    self.unprepare(finding)
                return
        conn = await self.connect("probe")
        await conn.close()

    async def connect(
        self, role: str, options: str | None = None, dsn: str | None = None
    ) -> psycopg.AsyncConnection[Any]:
        return await psycopg.AsyncConnection.connect(
            dsn or self.dsn, autocommit=True, application_name=f"pgjobs-{role}:{self.name}", connect_timeout=10,
            **self.conn_kwargs(options),
        )  # fmt: skip

    async def call(self, call: Call[T]) -> T:
        """One round trip on the pool; connection errors are retried with backoff (every call is a lease-token
        CAS, so a replay after a lost reply changes nothing); gives up after ~30 s."""
        failures = raced = 0
        while True:
            assert self.pool is not None
            try:
                # Shielded: a stop (or a cancelled handler) that arrives during the round trip waits for its
                # end. Interrupted, psycopg cancels the query, is interrupted again, throws the connection away
                # and logs a warning (stop() right after run()), and the call's outcome is unknown.
                with anyio.CancelScope(shield=True), anyio.fail_after(CALL_SHIELD):
                    async with self.pool.connection() as conn:
                        result = await run_on(conn, call, self.prepare)
                if self.outage.down:
                    self.outage.restored("pool")
                return result
            except TRANSIENT_ERRORS as exc:
                raced += 1
                await self.lost_race(_call_name(call.query), exc, raced)
            except PREPARED_LOST as exc:
                self.unprepare(exc)
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                failures += 1
                self.cut_off_at = anyio.current_time()
                if failures > 8:
                    raise
                await self.check_pool()
                delay = backoff_delay(failures, 0.1, 5.0)
                self.outage.lost("database call", exc, delay)
                await anyio.sleep(delay)
            except psycopg.Error as exc:
                raise translate(exc) from exc

    async def lost_race(self, what: str, exc: psycopg.Error, failures: int, *, give_up: bool = True) -> None:
        """After a lost race (:data:`TRANSIENT_ERRORS`): counted, logged, and a short pause before the retry;
        raised (translated) when the statement lost ``TRANSIENT_TRIES`` times in a row, unless ``give_up`` is
        False: the completer's batch holds outcomes of attempts that ran, and raising would end the worker and
        leave those jobs to run again (a connection error there is retried for as long, too)."""
        if failures >= TRANSIENT_TRIES and give_up:
            raise translate(exc) from exc
        self.transient_retries += 1
        level = logging.INFO if failures < TRANSIENT_TRIES else logging.WARNING
        log.log(level, "%s lost a race (%s %s); running it again", what, getattr(exc, "sqlstate", None),
                str(exc).splitlines()[0] if str(exc) else type(exc).__name__)  # fmt: skip
        await anyio.sleep(transient_delay(min(failures, TRANSIENT_TRIES)))

    async def check_pool(self) -> None:
        """After a connection error: drop every broken idle connection of the pool at once. A server restart
        breaks them all, and without this each one would fail one more call (a renewal, a report) in turn."""
        pool = self.pool
        if pool is None:
            return
        with anyio.move_on_after(5.0), contextlib.suppress(Exception):
            await pool.check()

    # ------------------------------------------------------------------------------------------ wake-ups

    def retry_now(self) -> None:
        ev = self._backoff_wait
        if ev is not None:
            self._backoff_wait = None
            ev.set()

    async def backoff(self, delay: float) -> None:
        """The pause after a connection error: ``delay`` seconds, or less when the LISTEN connection is
        re-established meanwhile (the server is back) or the worker is asked to stop."""
        if self._backoff_wait is None:
            self._backoff_wait = anyio.Event()
        ev = self._backoff_wait
        with anyio.move_on_after(delay):
            await ev.wait()

    def wake_all(self, why: str) -> None:
        for q in self.queue_states:
            q.wake(why)

    def poke_completer(self) -> None:
        ev = self.completer_wait
        if ev is not None:
            ev.set()

    def poke_poller(self) -> None:
        # (the poller makes its event before it reads the next due time: a poke during the read ends its sleep)
        if self.poller_wait is not None:
            self.poller_wait.set()

    def poke_renewer(self) -> None:
        if self.renewer_wait is not None:
            self.renewer_wait.set()

    def call_later(self, delay: float, fn: Any, *args: Any) -> asyncio.TimerHandle:
        assert self.loop is not None
        return self.loop.call_later(delay, fn, *args)

    # ------------------------------------------------------------------------------------------ JobRuntime
    # What a handler's ctx.save_checkpoint / report_progress / add_to_batch run (on the event loop). A value of
    # None goes out as JSON null (Jsonb), not SQL NULL, as it always did.

    async def checkpoint(self, id: int, lease_token: str, value: Any) -> bool:
        ok: bool = await self.call(checkpoint_call(id, lease_token, Jsonb(value)))
        return bool(ok)

    async def progress(self, id: int, lease_token: str, value: Any) -> bool:
        ok: bool = await self.call(progress_call(id, lease_token, Jsonb(value)))
        return bool(ok)

    async def run_call(self, call: Call[T]) -> T:
        return await self.call(call)

    async def add_to_batch(
        self, id: int, lease_token: str, spec: Mapping[str, Any], before_continuations: bool
    ) -> int | None:
        added = await self.call(add_to_batch_call(id, lease_token, spec, before_continuations))
        return None if added is None else int(added)

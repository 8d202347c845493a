"""The claimer: per served queue, a loop on its own connection that claims jobs and hands them to the slots.

Each claim asks for ``max_jobs = free capacity`` with ``kind_limits = {kind: free capacity}`` for every kind the
app has a handler for. It claims again while calls come back full, and otherwise sleeps until a
``pgjobs_wake`` for its queue, a slot frees up after a full claim, the end of a job of its queue when the queue
has a cap (``max_active``, ``max_active_per_group``: the end made room, see ``listener.read_caps``), or the
poll fallback. After a full claim that was dear (GATHER_PER_JOB), with fewer than half of its chunk free, it
first waits (at most as long as that claim took) for more slots to free.
Kinds registered with ``parent_results=True`` get their parents' results in one more round trip per claim, on
the same connection.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import anyio
import psycopg

from pgjobs.client.claim import CLAIM_SQL, RELEASE_CLAIMED_SQL, bigint_array_literal, text_array_literal
from pgjobs.client.graph import PARENT_RESULTS_MANY_SQL
from pgjobs.client.listen import backoff_delay
from pgjobs.client.pooler import PREPARED_LOST
from pgjobs.errors import translate
from pgjobs.runtime.app import JobHandler
from pgjobs.runtime.leases import renew_held
from pgjobs.runtime.state import (
    CLAIM_OPTIONS,
    RECONNECT_CAP,
    TRANSIENT_ERRORS,
    TRANSIENT_TRIES,
    HeldJob,
    QueueState,
    WorkerState,
)

log = logging.getLogger("pgjobs.worker")


def _kind_limits(w: WorkerState, free: int) -> str:
    text = w.limits_cache.get(free)
    if text is None:
        text = json.dumps({k: free for k in w.app.handlers})
        if len(w.limits_cache) < 4096:
            w.limits_cache[free] = text
    return text


async def _sleep(q: QueueState, free: int) -> None:
    """Until a wake for the queue, or a free slot when the last claim came back full."""
    ev = anyio.Event()
    q.waiters[ev] = "slot" if free <= 0 and q.more else "wake"
    try:
        await ev.wait()
    finally:
        del q.waiters[ev]


# A full claim that took at least this long per job is dear: the next one waits for room (_gather).
GATHER_PER_JOB = 0.00015
# The least time a claim may take before the claimer gives up on its connection (else the lease, if longer): a
# server that stopped answering, or a claim stuck for that long, is an outage (reconnect, back off), not a crash.
CLAIM_DEADLINE_MIN = 10.0


async def _gather(q: QueueState, within: float) -> None:
    """Until half a chunk is free, or ``within`` seconds (the time the last full claim took). Why: under a backlog
    a claimer that took whatever was free fell into a rhythm of one full claim and one of a few jobs (the fair
    soak under a held snapshot: claims of 45 and 5 in turn, 10,200 a minute), and there each call is dear. Only
    after a dear claim (GATHER_PER_JOB: 0.2 ms a job and more under the held snapshot, 0.04-0.09 without one):
    waiting after every full claim cost clean throughput 6-8 % (README, "Ten minutes held, fair queue")."""
    with anyio.move_on_after(within):
        while 2 * (q.capacity - q.running - q.reserved) < q.chunk and q.running > 0:
            ev = anyio.Event()
            q.waiters[ev] = "slot"
            try:
                await ev.wait()
            finally:
                del q.waiters[ev]


async def _open(w: WorkerState, failures: int) -> tuple[psycopg.AsyncConnection[Any], psycopg.AsyncCursor[Any]]:
    """The claim connection and its cursor. Back from a connection failure (an outage?): the leases of the jobs
    we hold ran on meanwhile, and the next claim would take our own expired jobs back (attempt + 1, run twice),
    so they are renewed first, on this connection that just proved the server is back."""
    conn = await w.connect("claim", CLAIM_OPTIONS)
    if failures:
        await renew_held(w, conn)
    return conn, conn.cursor()


async def _claim(w: WorkerState, cur: psycopg.AsyncCursor[Any], args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    """One claim call. Shielded: a claim cancelled on its way (the stop's last resort cancels every task) may still
    commit on the server, and its jobs would stay leased to nobody until the lease runs out. The deadline bounds
    the wait on a server that stopped answering; past it psycopg cancels the query and closes the connection."""
    deadline = max(CLAIM_DEADLINE_MIN, w.lease)
    with anyio.CancelScope(shield=True, deadline=anyio.current_time() + deadline) as scope:
        await cur.execute(CLAIM_SQL, args, prepare=w.prepare)
    if scope.cancelled_caught:  # (no rows to read: an outage for the caller, as a lost connection is)
        raise psycopg.OperationalError(f"the claim did not answer within {deadline:g} s")
    return await cur.fetchall()


def _full_claim_time(took: float, got: int, want: int) -> float:
    """The claim's time when it came back full and took long enough to gather for (see _gather), else 0."""
    return took if got >= want and took >= want * GATHER_PER_JOB else 0.0


async def claim_loop(w: WorkerState, q: QueueState) -> None:
    conn: psycopg.AsyncConnection[Any] | None = None
    cur: psycopg.AsyncCursor[Any] = None  # type: ignore[assignment]  # set with conn
    failures = raced = 0
    took = 0.0  # the last claim's time when it came back full, else 0 (see _gather)
    queues = text_array_literal([q.name])
    lease = f"{w.lease} seconds"
    handlers = w.app.handlers
    try:
        while not w.stopping:
            free = q.capacity - q.running - q.reserved
            if free <= 0 or not q.more or not handlers:
                await _sleep(q, free)
                continue
            if took > 0.0 and 2 * free < q.chunk:
                await _gather(q, min(took, 0.05))
                took = 0.0
                continue
            want = min(free, q.chunk)
            trigger = q.why
            q.more = False  # a wake that arrives while this claim runs sets it again
            q.reserved += want
            try:
                if conn is None or conn.closed:
                    conn, cur = await _open(w, failures)
                t0 = time.perf_counter()
                rows = await _claim(w, cur, (w.name, queues, want, lease, _kind_limits(w, want)))
                took = _full_claim_time(time.perf_counter() - t0, len(rows), want)
                w.claim_calls += 1
                w.claims_by_trigger[trigger] += 1
                if rows:
                    w.claimed_by_trigger[trigger] += len(rows)
                if w.metrics is not None:
                    w.metrics.claim(q.name, len(rows), time.perf_counter() - t0)
                if w.outage.down:
                    w.outage.restored(f"claim on queue {q.name!r}")
                failures = raced = 0
            except TRANSIENT_ERRORS as exc:
                # A lost race (state.TRANSIENT_SQLSTATES; with jobs partitioned, a row moved under the claim):
                # nothing claimed, claim again on the same connection (no outage: no reconnect, no reaping hold).
                raced += 1
                q.mark("retry")
                await w.lost_race(f"claim on queue {q.name!r}", exc, raced)
                continue
            except PREPARED_LOST as exc:
                w.unprepare(exc)  # a pooler lost the prepared claim: it did not run; claim again, unprepared
                q.mark("retry")
                continue
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                failures += 1
                w.cut_off_at = anyio.current_time()
                delay = backoff_delay(failures, 0.05, RECONNECT_CAP)
                w.outage.lost(f"claim on queue {q.name!r}", exc, delay)
                if conn is not None:
                    await conn.close()
                    conn = None
                q.mark("retry")
                await w.backoff(delay)
                continue
            except psycopg.Error as exc:
                raise translate(exc) from exc
            finally:
                q.reserved -= want
            if len(rows) >= want:
                q.wake("full")  # (poke: a sibling claimer may take more meanwhile)
            elif w.rate_limited:
                w.poke_poller()  # the next due time may be a token this claim waited for (listener.read_caps)
            if rows and w.stopping:
                # The answer of a claim that was on its way when the stop began: the slots may be gone already.
                await _release_claimed(w, cur, rows)
                continue
            if rows:
                parents = None
                if w.wants_parents and any((h := handlers.get(r[1])) is not None and h.parent_results for r in rows):
                    parents = await _parent_results(w, cur, rows)
                dispatch(w, q, rows, parents)
    finally:
        if conn is not None:
            with anyio.CancelScope(shield=True):
                await conn.close()


async def _release_claimed(w: WorkerState, cur: psycopg.AsyncCursor[Any], rows: list[tuple[Any, ...]]) -> None:
    """Gives back, in one round trip on the claim connection, jobs claimed after the stop began (attempt refunded).
    Shielded and bounded like the claim: a failure leaves them to their lease, and says so."""
    # in id order: one statement releasing many rows locks them one after the other, and every multi-row
    # statement over jobs locks in id order (no deadlock with another one over some of the same rows)
    rows = sorted(rows, key=lambda r: int(r[0]))
    ids = bigint_array_literal([r[0] for r in rows])
    tokens = "{" + ",".join(str(r[6]) for r in rows) + "}"
    raced = 0
    while True:
        try:
            with anyio.CancelScope(shield=True, deadline=anyio.current_time() + max(5.0, w.lease / 3)):
                await cur.execute(RELEASE_CLAIMED_SQL, (ids, tokens))
                got = await cur.fetchone()
            w.released += int(got[0]) if got else 0
            w.claimed += len(rows)
            return
        except psycopg.Error as exc:
            raced += 1
            if isinstance(exc, TRANSIENT_ERRORS) and raced < TRANSIENT_TRIES:  # lost a race: nothing released, again
                with anyio.CancelScope(shield=True):
                    await w.lost_race(f"release of {len(rows)} job(s) claimed as the worker stopped", exc, raced)
                continue
            log.warning("%d job(s) claimed as the worker stopped could not be released (%s); their leases will"
                        " expire", len(rows), exc)  # fmt: skip
            return


async def _parent_results(w: WorkerState, cur: psycopg.AsyncCursor[Any], rows: list[tuple[Any, ...]]) -> dict[int, str]:
    """{job id: its parents' results as JSON text} for the claimed jobs whose kind asked for them.
    On the claim connection, right after the claim: a connection error here loses nothing (the jobs run
    with ctx.parent_results = None rather than wait)."""
    handlers = w.app.handlers
    ids = [r[0] for r in rows if (h := handlers.get(r[1])) is not None and h.parent_results]
    try:
        await cur.execute(PARENT_RESULTS_MANY_SQL, (bigint_array_literal(ids),), prepare=w.prepare)
        return {r[0]: r[1] for r in await cur.fetchall()}
    except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
        log.warning("parent_results of %d claimed job(s) failed: %s", len(ids), exc)
        return {}


def dispatch(w: WorkerState, q: QueueState, rows: list[tuple[Any, ...]], parents: dict[int, str] | None = None) -> None:
    """Claimed rows become held jobs in the queue's ``ready`` line; one parked slot is woken."""
    handlers = w.app.handlers
    jobs = w.jobs
    ready = q.ready
    n = 0
    for row in rows:
        handler = handlers.get(row[1])
        job = HeldJob(row, handler, q) if handler is not None else None
        if job is None:  # cannot happen with kind_limits; give it back rather than hold it
            log.error("claimed job %s of kind %r without a handler; releasing it", row[0], row[1])
            bogus = HeldJob(row, JobHandler(row[1], lambda p, c: None), q)
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
    w.claimed += n
    if w.stopping:  # claimed by a call that was in flight when stop() came: give them back
        for job in list(ready)[-n:]:
            job.stop_reason = "shutdown"
    parked = q.parked
    if parked:
        parked.pop().set()  # each woken slot wakes the next while jobs remain (see runner.slot)

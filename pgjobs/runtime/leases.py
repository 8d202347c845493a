"""Leases and presence: the renewer, the heartbeat, the reaping of silent workers.

* the **renewer**: every ``lease / 3`` one ``renew_leases`` for all held jobs. A job missing from its answer
  lost its lease (reclaimed elsewhere): its handler is cancelled and nothing is reported for it. A job
  reported ``cancel_requested`` is cancelled (``HeldJob.cancel_requested``): this is how a ``pgjobs_cancel`` hint is
  confirmed (the listener asks for a renewal at once) and how a missed one is caught. A job reported with
  ``renewed`` false was busy in another transaction (its completion on the way, a cancel, a
  checkpoint: ``renew_leases`` never waits for a row, see sql/lifecycle.sql): not renewed, not lost; the
  renewer asks again soon. A renewal that lost a race (40001/40P01) is retried like one that could not reach
  the database;
* the **heartbeat**: ``worker_heartbeat(name, meta)`` and ``reap_workers`` every ``heartbeat_interval``; no
  reaping until ``reap_after`` has passed since the server started and since this worker last failed to reach
  it (after an outage every worker's heartbeat is stale, and the first one back would take the others' running
  jobs).
"""

from __future__ import annotations

import logging
import os
import socket
from datetime import timedelta
from typing import Any

import anyio
import psycopg

from pgjobs.client._call import prepare_mode
from pgjobs.client.lifecycle import RENEW_LEASES_SQL
from pgjobs.client.listen import backoff_delay
from pgjobs.client.workers import deregister_worker_call, reap_workers_after_restart_call, worker_heartbeat_call
from pgjobs.runtime.state import RUNNING, TRANSIENT_ERRORS, WorkerState
from pgjobs.runtime.unhandled import report_unhandled

log = logging.getLogger("pgjobs.worker")

# How soon the renewer asks again for jobs that were busy (renew_leases answered renewed = false), and
# the most it backs off to while they stay busy. Capped low, not at lease/3: the renewal no longer waits for the
# row, so the retry after the row is freed is what renews it, and a transaction that held the row for most of
# a lease left the lease to run out a whole backoff after it let go (another claimer then took the job while it
# ran here). 2 calls a second at most, and only while some row stays busy.
BUSY_RETRY = 0.1
BUSY_RETRY_CAP = 0.5


async def renewer(w: WorkerState) -> None:
    interval = w.lease / 3
    failures = busy = 0
    while True:
        # After a failed renewal (the database restarting) try again soon rather than a third of a lease
        # later: the leases ran on while the server was away, and a claimer elsewhere may take them.
        if failures:
            await w.backoff(min(interval, backoff_delay(failures, 0.05, 1.0)))
        elif w.renew_busy:
            # Some held jobs were busy (not renewed): ask again soon, so a row that stays busy for a while (a
            # transaction that holds it) is still renewed in time; backing off while it stays busy.
            busy += 1
            await w.backoff(min(interval, BUSY_RETRY_CAP, BUSY_RETRY * 2 ** min(busy - 1, 8)))
        else:
            busy = 0
            # every lease/3, or at once when a pgjobs_cancel hint names a job we hold (listener.on_notify)
            w.renewer_wait = anyio.Event()
            with anyio.move_on_after(interval):
                await w.renewer_wait.wait()
            w.renewer_wait = None
        failures = 0 if await renew_held(w) else failures + 1


async def renew_held(w: WorkerState, conn: psycopg.AsyncConnection[Any] | None = None) -> bool:
    """One ``renew_leases`` for every job this worker holds (on ``conn``, else a pooled connection); False
    when the database could not be reached. Jobs whose outcome is being reported (FINISHING, or waiting in
    the completer) are renewed too: a report that retries through an outage must not let the lease lapse
    and the job run again."""
    held = list(w.jobs.values())
    pending = list(w.in_flight) + list(w.done)
    if not held and not pending:
        w.renew_busy = False
        return True
    ids = [j.id for j in held] + [p[0] for p in pending]
    tokens = [j.token for j in held] + [p[1] for p in pending]
    prepare = prepare_mode(w.prepare)
    try:
        if conn is not None:
            rows = await (await conn.execute(RENEW_LEASES_SQL, (ids, tokens, w.lease_td), prepare=prepare)).fetchall()
        else:
            assert w.pool is not None
            async with w.pool.connection() as pooled:
                rows = await (
                    await pooled.execute(RENEW_LEASES_SQL, (ids, tokens, w.lease_td), prepare=prepare)
                ).fetchall()
    except TRANSIENT_ERRORS as exc:
        # A lost race (40001/40P01, see state.TRANSIENT_SQLSTATES): the renewer runs it again soon, as after a
        # connection error, but this is no outage (no reconnect, no hold on reaping).
        w.transient_retries += 1
        log.info("lease renewal of %d job(s) lost a race (%s); running it again", len(ids), exc.sqlstate)
        return False
    except psycopg.Error as exc:
        if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
            w.outage.lost(f"lease renewal of {len(ids)} job(s)", exc)
        else:
            log.warning("lease renewal of %d job(s) failed: %s", len(ids), exc)
        if conn is None and isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
            w.cut_off_at = anyio.current_time()
            await w.check_pool()
        return False
    still = {r[0]: (r[1], r[2]) for r in rows}
    busy = False
    for job in held:
        if job.id not in still:
            # Reclaimed elsewhere (or settled): this attempt's outcome no longer counts.
            if w.jobs.get(job.id) is job and job.phase == RUNNING:
                job.interrupt("lease lost")
        elif not still[job.id][1]:
            # Busy in another transaction, not renewed this time: kept (its lease still runs), asked again soon.
            busy = busy or w.jobs.get(job.id) is job
        elif still[job.id][0]:
            job.cancel_requested()
    # (a busy job among those whose outcome is being reported is its own completion: nothing to ask again)
    w.renew_busy = busy
    return True


def worker_meta(w: WorkerState) -> dict[str, Any]:
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "queues": w.queues,
        "concurrency": sum(w.queues.values()),
        "active": w.active,
        "kinds": w.app.kinds,
        # list_workers calls a worker stale after three of these without a heartbeat
        "heartbeat_interval": w.heartbeat_interval,
    }


async def heartbeat_once(w: WorkerState) -> None:
    await w.call(worker_heartbeat_call(w.name, worker_meta(w)))


async def heartbeat(w: WorkerState) -> None:
    stale_after = timedelta(seconds=w.reap_after)
    while True:
        await anyio.sleep(w.heartbeat_interval)
        try:
            await heartbeat_once(w)
        except Exception as exc:
            _failed(w, "heartbeat", exc)
            continue
        try:
            await report_unhandled(w)
        except Exception as exc:
            _failed(w, "unhandled_kinds", exc)
        cut_off_at = w.cut_off_at
        if cut_off_at is not None and anyio.current_time() - cut_off_at < w.reap_after:
            # We could not reach the database a moment ago: nor could the others, probably, and their
            # heartbeats are as stale as ours was. Reaping now would take running jobs from live workers.
            continue
        try:
            reaped = await w.call(reap_workers_after_restart_call(stale_after))
        except Exception as exc:
            _failed(w, "reap_workers", exc)
            continue
        if reaped:
            log.info("reaped %d silent worker(s); their jobs are claimable now", reaped)
            w.wake_all("reaped")


def _failed(w: WorkerState, what: str, exc: BaseException) -> None:
    """A background call's failure: part of the outage when the database is unreachable, else a warning."""
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        w.outage.lost(what, exc)
    else:
        log.warning("%s failed: %s", what, exc)


async def deregister(w: WorkerState) -> None:
    """On stop, after the heartbeat ended: ``deregister_worker`` (the worker is no longer listed; a job it
    could not release becomes claimable at once). Bounded: a database that is down cannot hold the exit, and
    the worker then goes stale and is reaped as if it had crashed."""
    with anyio.move_on_after(5.0, shield=True):
        try:
            gone = await w.call(deregister_worker_call(w.name))
        except Exception as exc:
            log.warning("could not deregister (%s); the worker will be reaped as stale", exc)
            return
        log.info(
            "deregistered%s", "" if gone else " (it was not registered any more)",
            extra={"event": "worker.deregistered", "worker": w.name},
        )  # fmt: skip

"""Wake-ups: the LISTEN loop's handling and the poll fallback.

* the **listener** (:class:`pgjobs.client.listen.Listener`): ``pgjobs_wake`` (payload: queue) wakes that
  queue's claimer, ``pgjobs_cancel`` (payload: job id) makes the renewer read the held jobs'
  ``cancel_requested`` now (a hint, confirmed in SQL before anything is cancelled); it reconnects with backoff
  and jitter, and wakes every claimer after a reconnect (a wake sent meanwhile is lost);
* the **poller**: wakes the claimers every ``poll_interval`` and at the next due ``run_at`` or lease expiry
  within it (``next_due_within``);
* the **caps reader**: which served queues have a cap, at start and every ``heartbeat_interval``: the end of a
  job of such a queue wakes its claimer in-process (``QueueState.ended``); and whether a rate limit may hold
  back their jobs: then a claim that comes back short re-arms the poller (the claim may have held jobs back
  to their next token times, or used up a queue's tokens), so it sleeps until the next token, not its interval.
"""

from __future__ import annotations

import logging

import anyio
import psycopg

from pgjobs.client.claim import capped_queues_call, next_due_in_call
from pgjobs.client.listen import Listener
from pgjobs.client.rates import rate_limited_call
from pgjobs.runtime.state import RECONNECT_CAP, WorkerState

log = logging.getLogger("pgjobs.worker")

WAKE_CHANNEL = "pgjobs_wake"
CANCEL_CHANNEL = "pgjobs_cancel"


def make_listener(w: WorkerState) -> Listener:
    async def on_connect() -> None:
        # Notifications sent while the connection was down are lost: look again at every queue.
        w.wake_all("listen")
        w.retry_now()  # the database is back: claimers and the completer in a backoff retry at once
        if w.outage.down:
            w.outage.restored("LISTEN")

    def on_error(exc: BaseException, delay: float) -> None:
        w.outage.lost("LISTEN", exc, delay)

    # LISTEN needs a session of its own: on listen_dsn (a direct connection) when dsn goes through a pooler.
    return Listener(
        w.listen_dsn or w.dsn,
        [WAKE_CHANNEL, CANCEL_CHANNEL],
        on_connect=on_connect,
        cap=RECONNECT_CAP,
        application_name=f"pgjobs-listen:{w.name}",
        on_error=on_error,
        options="-c jit=off" if w.prepare else None,  # prepare=False: no startup options on any connection
    )


def on_notify(w: WorkerState, channel: str, payload: str) -> None:
    if channel == WAKE_CHANNEL:
        q = w.queue_by_name.get(payload)
        if q is not None:
            q.wake("wake")
    elif channel == CANCEL_CHANNEL:
        # Only a hint: any role may NOTIFY any channel, so a forged payload must cancel nothing. For a job we
        # hold, renew the leases now: renew_leases reports cancel_requested from the row, and only that
        # cancels (leases.renew_held), a round trip after the hint.
        try:
            held = int(payload) in w.jobs
        except ValueError:
            return
        if held:
            w.poke_renewer()


async def poller(w: WorkerState) -> None:
    """Sleeps until the poll interval or the next due time of its queues (a ``run_at`` or a lease expiry), then
    wakes their claimers. The read of the next due time comes before the claims it starts: next_due_within
    looks from the read's own time on, so a job falling due between a claim and a later read would be in
    neither, and wait for the poll. Read first, every job due after the read is in it, and every job due
    before the claim is claimed."""
    names = list(w.queues)
    due = False  # the last sleep ended at its deadline (a due time or the interval), not by a poke
    while True:
        # Made before the read: a job parked or rescheduled while the read runs pokes it, and the sleep below
        # ends at once for another read. Made after the read, that poke found no event and was lost.
        woken = w.poller_wait = anyio.Event()
        try:
            due_in = await w.call(next_due_in_call(names, within=w.poll_interval))
        except Exception as exc:
            if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
                w.outage.lost("next_due_at", exc)
            else:
                log.warning("next_due_at failed: %s", exc)
            due_in = None
        if due:
            w.wake_all("poll")
        delay = w.poll_interval
        if due_in is not None:
            delay = min(delay, max(due_in, 0.0) + 0.002)
        # A poke (a park, a reschedule, a claim a rate limit cut short) only asks for a new read: the claimers
        # are woken when a due time comes, not before it, so a limited queue is not claimed in a loop.
        with anyio.move_on_after(delay) as sleep:
            await woken.wait()
        due = sleep.cancelled_caught


async def read_caps(w: WorkerState) -> None:
    """Which served queues have a cap (``QueueState.capped``): read at start and with every heartbeat. A claim
    the cap cut short sleeps until a wake; this worker's own ends of such a queue's jobs wake its claimer
    in-process (``QueueState.ended``), and every worker's ends send ``pgjobs_wake`` (sql/wakeups.sql), which also
    covers a cap configured since the last read. A failed read keeps what was known (logged, never raised)."""
    try:
        names: list[str] = await w.call(capped_queues_call(list(w.queues)))
    except Exception as exc:
        if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
            w.outage.lost("capped_queues", exc)
        else:
            log.warning("could not read which queues have a cap (%s); their claims wait for a wake", exc)
        return
    for q in w.queue_states:
        q.capped = q.name in names
    try:
        limited = await w.call(rate_limited_call(list(w.queues)))
        if limited and not w.rate_limited:
            w.poke_poller()  # (claims made before this read did not re-arm it)
        w.rate_limited = limited
    except Exception as exc:
        if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
            w.outage.lost("rate_limited", exc)  # (the one outage line, as every read here)
        else:
            log.warning("could not read whether rate limits hold back the served queues (%s)", exc)


async def caps_reader(w: WorkerState) -> None:
    """:func:`read_caps` every ``heartbeat_interval``."""
    while True:
        await anyio.sleep(w.heartbeat_interval)
        await read_caps(w)

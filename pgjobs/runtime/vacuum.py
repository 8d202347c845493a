"""The vacuumer: the hot tables vacuumed from the worker when autovacuum will not (sql/vacuum.sql).

Every ``heartbeat_interval``: ``vacuum_due(vacuumed_under)`` on the pool; when it lists tables, ``VACUUM
(SKIP_LOCKED, ANALYZE)`` of each on a connection of its own (autocommit, closed after; a VACUUM takes seconds on
a big table, and must not hold a pool connection the claims need). ``vacuumed_under`` is the horizon of this worker's
last pass: while the same snapshot holds the dead versions, vacuuming again would remove nothing. Several
workers may list the same table; SKIP_LOCKED makes the second one pass. Off with ``Worker(vacuum=False)``.
"""

from __future__ import annotations

import logging

import anyio
import psycopg

from pgjobs.client.vacuum import vacuum_due_call, vacuum_tables_async
from pgjobs.errors import PgJobsError, SchemaMissing
from pgjobs.runtime.state import WorkerState

log = logging.getLogger("pgjobs.worker")


async def vacuumer(w: WorkerState) -> None:
    horizon: str | None = None
    while True:
        await anyio.sleep(w.heartbeat_interval)
        try:
            horizon = await vacuum_once(w, horizon)
        except SchemaMissing:
            log.info("this schema has no vacuum_due (pgjobs migrate adds it): the worker vacuums nothing")
            return
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            # The database gone (or a failover under way) is the worker's one outage line, not a line of its own.
            w.outage.lost("vacuum", exc)
        except (psycopg.Error, PgJobsError) as exc:
            log.warning("vacuum failed: %s", exc)


async def vacuum_once(w: WorkerState, horizon: str | None) -> str | None:
    """One pass: the tables due, each vacuumed; returns the horizon to pass next time."""
    due = await w.call(vacuum_due_call(horizon))
    if not due:
        return horizon
    conn = await w.connect("vacuum")
    try:
        took = await vacuum_tables_async(conn, due)
    finally:
        await conn.close()
    for d, seconds in zip(due, took, strict=True):
        log.info("vacuumed %s (%d dead tuples) in %.2f s", d.qualified, d.dead_tuples, seconds)
    return due[0].horizon

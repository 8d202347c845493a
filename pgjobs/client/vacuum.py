"""Vacuum of the hot tables when autovacuum will not (sql/vacuum.sql): what is due, and the VACUUM itself.

VACUUM cannot run inside a function or a transaction block, so the statement is the client's: ``VACUUM
(SKIP_LOCKED, ANALYZE)`` of each listed table on an autocommit connection (a table another VACUUM or autovacuum
holds is skipped, not waited for). The workers (pgjobs/runtime/vacuum.py) and ``pgjobs maintain`` use these.

ANALYZE too: where autovacuum does not vacuum, it does not analyze either, and a table never analysed has no
column statistics. The planner then guesses every equality at 0.5 % and two indexes tie; on a fair queue the
group head probe took ``jobs_pending_idx`` (passing every pending entry of the queue, dead ones included)
instead of ``jobs_group_idx`` (that group's only): after 6,000 jobs under a held snapshot one claim of 10 was
handed 61,700 index entries instead of 820 (10 ms against 2.1). The sample costs less than the VACUUM it
rides on, which reads the whole table anyway.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from psycopg import sql
from psycopg.rows import dict_row

from pgjobs.client._call import AsyncConn, Call, Rows, SyncConn


@dataclass(frozen=True, slots=True)
class VacuumDue:
    """A pgjobs table that VACUUM should visit now (``vacuum_due``)."""

    relation: str  # the table's name in schema pgjobs
    dead_tuples: int
    live_tuples: int
    horizon: str  # the database's oldest snapshot (xmin) when listed, '' for none: pass back as vacuumed_under

    @property
    def qualified(self) -> str:
        return f"pgjobs.{self.relation}"


def _due(rows: Rows) -> list[VacuumDue]:
    return [VacuumDue(r["relation"], int(r["dead_tuples"]), int(r["live_tuples"]), r["horizon"]) for r in rows]


def vacuum_due_call(vacuumed_under: str | None = None) -> Call[list[VacuumDue]]:
    """The tables due (none when ``vacuumed_under``, the horizon of the caller's last pass, has not moved)."""
    return Call("SELECT * FROM pgjobs.vacuum_due(vacuumed_under => %(v)s)", {"v": vacuumed_under}, _due)


def vacuum_statement(relation: str) -> sql.Composed:
    return sql.SQL("VACUUM (SKIP_LOCKED, ANALYZE) {}").format(sql.Identifier("pgjobs", relation))


def vacuum_due_now(conn: SyncConn, vacuumed_under: str | None = None) -> list[VacuumDue]:
    call = vacuum_due_call(vacuumed_under)
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(call.query, call.params)
        return call.parse(cur.fetchall())


def vacuum_tables(conn: SyncConn, due: list[VacuumDue]) -> list[float]:
    """VACUUMs each table (``conn`` must be in autocommit); the seconds each one took."""
    took: list[float] = []
    for d in due:
        t0 = time.perf_counter()
        conn.execute(vacuum_statement(d.relation))
        took.append(time.perf_counter() - t0)
    return took


async def vacuum_tables_async(conn: AsyncConn, due: list[VacuumDue]) -> list[float]:
    """:func:`vacuum_tables` on an async connection."""
    took: list[float] = []
    for d in due:
        t0 = time.perf_counter()
        await conn.execute(vacuum_statement(d.relation))
        took.append(time.perf_counter() - t0)
    return took

"""Invariants of the job model, checked in SQL over the whole database.

Used by the fuzz suite (after every call that succeeded) and the stateful lifecycle model (after every
step). Each query returns the rows that break its invariant; ``violations`` names them.
"""

from __future__ import annotations

from typing import Any

import psycopg

Conn = psycopg.Connection[Any]

INVARIANTS = {
    # an active job holds exactly one lease (one token, an expiry); any other state holds none
    "active jobs have a lease token, others none": """
        SELECT id, state FROM pgjobs.jobs
         WHERE (state = 'active') <> (lease_token IS NOT NULL)
            OR (state = 'active') <> (lease_expires_at IS NOT NULL)""",
    "terminal jobs have completed_at, live ones none": """
        SELECT id, state FROM pgjobs.jobs
         WHERE (state IN ('succeeded', 'failed', 'cancelled')) <> (completed_at IS NOT NULL)""",
    "batch counters equal a recount of the members": """
        SELECT b.id, b.total, b.pending, b.succeeded, b.failed, b.cancelled, c.*
          FROM pgjobs.batches AS b
          CROSS JOIN LATERAL (
                SELECT count(j.id)::int AS r_total,
                       count(j.id) FILTER (WHERE j.state NOT IN ('succeeded', 'failed', 'cancelled'))::int AS r_pending,
                       count(j.id) FILTER (WHERE j.state = 'succeeded')::int AS r_succeeded,
                       count(j.id) FILTER (WHERE j.state = 'failed')::int AS r_failed,
                       count(j.id) FILTER (WHERE j.state = 'cancelled')::int AS r_cancelled
                  FROM pgjobs.jobs AS j WHERE j.batch_id = b.id) AS c
         WHERE (b.total, b.pending, b.succeeded, b.failed, b.cancelled)
               <> (c.r_total, c.r_pending, c.r_succeeded, c.r_failed, c.r_cancelled)""",
    "a batch's state follows its counters": """
        SELECT b.id, b.state, b.pending, b.failed, b.cancelled FROM pgjobs.batches AS b
         WHERE b.state::text <> CASE WHEN b.pending > 0 THEN 'executing' WHEN b.failed > 0 THEN 'failed'
                                     WHEN b.cancelled > 0 THEN 'cancelled' ELSE 'succeeded' END""",
    "remaining_deps equals the unsettled edges of a waiting job": """
        SELECT j.id, j.state, j.remaining_deps, c.n FROM pgjobs.jobs AS j
          CROSS JOIN LATERAL (SELECT count(*)::int AS n FROM pgjobs.edges AS e
                               WHERE e.child_id = j.id AND e.satisfied IS NULL) AS c
         WHERE j.state = 'waiting' AND j.remaining_deps <> c.n""",
    "a job waits exactly while an edge is unsettled": """
        SELECT j.id, j.state FROM pgjobs.jobs AS j
         WHERE j.state IN ('scheduled', 'pending', 'active', 'succeeded', 'failed')
           AND EXISTS (SELECT 1 FROM pgjobs.edges AS e WHERE e.child_id = j.id AND e.satisfied IS NULL)""",
    "nothing runs with an unsatisfied edge": """
        SELECT j.id, j.state FROM pgjobs.jobs AS j
         WHERE j.state IN ('pending', 'active', 'succeeded', 'failed')
           AND EXISTS (SELECT 1 FROM pgjobs.edges AS e WHERE e.child_id = j.id AND e.satisfied IS NOT TRUE)""",
}


def violations(conn: Conn) -> dict[str, list[tuple[Any, ...]]]:
    """Every broken invariant, with the rows that break it (empty: all hold)."""
    out: dict[str, list[tuple[Any, ...]]] = {}
    for name, query in INVARIANTS.items():
        rows = [tuple(r) for r in conn.execute(query).fetchall()]  # type: ignore[arg-type]
        if rows:
            out[name] = rows[:5]
    return out


def digest(conn: Conn) -> str:
    """A cheap digest of every row of every pgjobs table (to prove a refused call changed nothing).

    Leaf tables only: a partitioned parent's rows are its partitions' rows, and planning the parents into the
    UNION ALL cost 20 ms a call where the leaves alone, prepared, cost 0.5 (the fuzz and model tests call it
    thousands of times)."""
    tables = [
        str(r[0])
        for r in conn.execute(
            "SELECT c.oid::regclass::text FROM pg_class AS c WHERE c.relnamespace = 'pgjobs'::regnamespace"
            " AND c.relkind = 'r' ORDER BY 1"
        ).fetchall()
    ]
    parts = " UNION ALL ".join(
        f"SELECT {i} AS t, coalesce(md5(string_agg(md5(x::text), '' ORDER BY md5(x::text))), '') AS h FROM {t} AS x"
        for i, t in enumerate(tables)
    )
    query = f"SELECT md5(string_agg(h, ',' ORDER BY t)) FROM ({parts}) AS d"
    row = conn.execute(query, prepare=True).fetchone()
    assert row is not None
    return str(row[0])

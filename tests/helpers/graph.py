"""Helpers of the workflow suites (test_graph, test_batches, test_graph_property).

Everything goes through the SQL contract by name; `take()` claims one job through `claim()` with a
kind limit, so each test job carries a kind of its own.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from uuid import UUID

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

Conn = psycopg.Connection[Any]
TERMINAL = ("succeeded", "failed", "cancelled")


def rows(conn: Conn, query: str, params: Any = None) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query, params)
        return cur.fetchall() if cur.description else []


def one(conn: Conn, query: str, params: Any = None) -> Any:
    result = rows(conn, query, params)
    assert len(result) == 1, result
    return next(iter(result[0].values()))


def enqueue_many(conn: Conn, specs: list[dict[str, Any]], as_batch: bool = False) -> dict[str, int]:
    """{ref: id} of the created (or found) jobs."""
    out = rows(conn, "SELECT * FROM pgjobs.enqueue_many(jobs => %s, as_batch => %s)", (Jsonb(specs), as_batch))
    return {r["ref"]: r["id"] for r in out}


def enqueue_rows(conn: Conn, specs: list[dict[str, Any]], as_batch: bool = False) -> list[dict[str, Any]]:
    return rows(conn, "SELECT * FROM pgjobs.enqueue_many(jobs => %s, as_batch => %s)", (Jsonb(specs), as_batch))


def state(conn: Conn, job_id: int) -> str:
    return str(one(conn, "SELECT state FROM pgjobs.jobs WHERE id = %s", (job_id,)))


def states(conn: Conn, ids: dict[str, int]) -> dict[str, str]:
    found = {
        r["id"]: r["state"]
        for r in rows(conn, "SELECT id, state FROM pgjobs.jobs WHERE id = ANY(%s)", (list(ids.values()),))
    }
    return {ref: found[i] for ref, i in ids.items()}


def take(conn: Conn, job_id: int, worker: str = "w") -> UUID:
    """Claims exactly this job (through claim(), limited to its kind); returns its lease token."""
    kind, queue = rows(conn, "SELECT kind, queue FROM pgjobs.jobs WHERE id = %s", (job_id,))[0].values()
    claimed = rows(
        conn,
        "SELECT * FROM pgjobs.claim(worker => %s, queues => %s::text[], max_jobs => 1, kind_limits => %s)",
        (worker, [queue], Jsonb({kind: 1})),
    )
    assert [c["id"] for c in claimed] == [job_id], (job_id, claimed, state(conn, job_id))
    return UUID(str(claimed[0]["lease_token"]))


def succeed(conn: Conn, job_id: int, result: Any = None, continuations: Any = None) -> None:
    token = take(conn, job_id)
    assert one(
        conn,
        "SELECT pgjobs.complete(id => %s, lease_token => %s, result => %s, continuations => %s)",
        (
            job_id,
            token,
            None if result is None else Jsonb(result),
            None if continuations is None else Jsonb(continuations),
        ),
    )


def fail(conn: Conn, job_id: int) -> None:
    token = take(conn, job_id)
    assert one(conn, "SELECT pgjobs.dead_letter(id => %s, lease_token => %s, error => 'boom')", (job_id, token))


def cancel(conn: Conn, job_id: int) -> bool:
    return bool(one(conn, "SELECT pgjobs.cancel(id => %s)", (job_id,)))


def batch(conn: Conn, batch_id: int) -> dict[str, Any]:
    found = rows(conn, "SELECT * FROM pgjobs.batch_status(batch_id => %s)", (batch_id,))
    assert len(found) == 1
    return found[0]


def recount(conn: Conn, batch_id: int) -> dict[str, int]:
    return rows(
        conn,
        """SELECT count(*)::int AS total,
                  count(*) FILTER (WHERE state NOT IN ('succeeded', 'failed', 'cancelled'))::int AS pending,
                  count(*) FILTER (WHERE state = 'succeeded')::int AS succeeded,
                  count(*) FILTER (WHERE state = 'failed')::int AS failed,
                  count(*) FILTER (WHERE state = 'cancelled')::int AS cancelled
             FROM pgjobs.jobs WHERE batch_id = %s""",
        (batch_id,),
    )[0]


def counters(status: dict[str, Any]) -> dict[str, int]:
    return {k: status[k] for k in ("total", "pending", "succeeded", "failed", "cancelled")}


_EVENTS_SQL = (
    "SELECT event_id, id, state::text AS state, queue, kind, attempt, batch_id"
    " FROM pgjobs.read_events(after_id => %s, max_rows => 100000)"
)


def log_head(conn: psycopg.Connection[Any]) -> int:
    """The newest event id, after a tick (so what committed before this call is not reported as new)."""
    conn.execute("SELECT count(*) FROM pgjobs.read_events(after_id => 9223372036854775806)")
    row = conn.execute("SELECT coalesce((SELECT newest_id FROM pgjobs.stream_bounds()), 0)").fetchone()
    return int(row[0]) if row else 0


def logged_since(conn: psycopg.Connection[Any], cursor: int) -> tuple[int, list[dict[str, Any]]]:
    """Status events logged after ``cursor`` (in the shape pgjobs_status payloads had), and the new cursor."""
    rows = conn.execute(_EVENTS_SQL, [cursor]).fetchall()
    out = [{"id": r[1], "state": r[2], "queue": r[3], "kind": r[4], "attempt": r[5], "batch_id": r[6]} for r in rows]
    return (rows[-1][0] if rows else cursor), out


class Listener:
    """Collects pgjobs_wake / pgjobs_cancel notifications on its own connection, and the status events logged
    since it was created (read_events: status changes left NOTIFY for the durable log), as
    ("pgjobs_status", event) pairs after the notifications."""

    def __init__(self, dsn: str) -> None:
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.conn.execute("LISTEN pgjobs_wake")
        self.conn.execute("LISTEN pgjobs_cancel")
        self.cursor = log_head(self.conn)

    def drain(self, timeout: float = 0.5) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = []
        for n in self.conn.notifies(timeout=timeout, stop_after=None):
            out.append((n.channel, n.payload))
        self.cursor, events = logged_since(self.conn, self.cursor)
        out += [("pgjobs_status", e) for e in events]
        return out

    def status_events(self, timeout: float = 0.5) -> list[dict[str, Any]]:
        return [e for ch, e in self.drain(timeout) if ch == "pgjobs_status"]

    def close(self) -> None:
        self.conn.close()


@contextmanager
def listening(dsn: str) -> Iterator[Listener]:
    listener = Listener(dsn)
    try:
        yield listener
    finally:
        listener.close()


def run_threads(n: int, target: Any) -> list[Any]:
    """Runs target(i) on n threads released together; re-raises the first error."""
    results: list[Any] = [None] * n
    errors: list[BaseException] = []
    barrier = threading.Barrier(n)

    def body(i: int) -> None:
        try:
            barrier.wait()
            results[i] = target(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if errors:
        raise errors[0]
    return results

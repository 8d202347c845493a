"""Small helpers shared by the foundation suites (test_enqueue, test_claim, test_lifecycle, ...).

They call the SQL contract by name with named arguments, exactly as any other program would; nothing here
goes around the functions except `expire()` and `backdate()`, which move the clock of a row instead of
sleeping (the tests never assert timings).
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any, TypeVar

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

Conn = psycopg.Connection[Any]
T = TypeVar("T")

# parameters whose Python value goes to the server as jsonb
_JSON_PARAMS = {"payload", "meta", "kind_limits", "jobs", "result", "continuations", "checkpoint", "progress", "job"}
# explicit casts where a bare Python value would not resolve the overload
_CASTS = {
    "priority": "::smallint",
    "noisy_share": "::real",
    "queues": "::text[]",
    "ids": "::bigint[]",
    "lease_tokens": "::uuid[]",
}
LIVE = ("waiting", "scheduled", "pending", "active")
TERMINAL = ("succeeded", "failed", "cancelled")


def _adapt(name: str, value: Any) -> Any:
    if name in _JSON_PARAMS and value is not None and not isinstance(value, Jsonb):
        return Jsonb(value)
    if isinstance(value, (int, float)) and name in {"lease", "stale_after", "succeeded_before", "failed_before"}:
        return timedelta(seconds=value)
    return value


def call(conn: Conn, function: str, /, **kwargs: Any) -> list[dict[str, Any]]:
    """``SELECT * FROM pgjobs.<function>(name => value, ...)``: every argument by name, as the contract allows."""
    args = sql.SQL(", ").join(
        sql.SQL("{} => {}{}").format(sql.Identifier(k), sql.Placeholder(k), sql.SQL(_CASTS.get(k, ""))) for k in kwargs
    )
    query = sql.SQL("SELECT * FROM pgjobs.{}({})").format(sql.Identifier(function), args)
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query, {k: _adapt(k, v) for k, v in kwargs.items()})
        return cur.fetchall() if cur.description else []


def scalar(conn: Conn, function: str, /, **kwargs: Any) -> Any:
    """The single value a scalar function returns."""
    result = call(conn, function, **kwargs)
    assert len(result) == 1, result
    return next(iter(result[0].values()))


def enqueue(conn: Conn, kind: str = "k", /, **kwargs: Any) -> dict[str, Any]:
    result = call(conn, "enqueue", kind=kind, **kwargs)
    assert len(result) == 1, result
    return result[0]


def enqueue_n(conn: Conn, n: int, kind: str = "k", **spec: Any) -> list[int]:
    """n jobs with one enqueue_many call; their ids in order."""
    result = call(conn, "enqueue_many", jobs=[{"kind": kind, **spec} for _ in range(n)])
    return [r["id"] for r in result]


def claim(conn: Conn, worker: str = "w", /, **kwargs: Any) -> list[dict[str, Any]]:
    return call(conn, "claim", worker=worker, **kwargs)


def claim_one(conn: Conn, worker: str = "w", /, **kwargs: Any) -> dict[str, Any]:
    got = claim(conn, worker, **kwargs)
    assert len(got) == 1, got
    return got[0]


def job(conn: Conn, id: int) -> dict[str, Any]:
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute("SELECT * FROM pgjobs.jobs WHERE id = %s", [id]).fetchone()
    assert row is not None, f"job {id} does not exist"
    return row


def exists(conn: Conn, id: int) -> bool:
    return conn.execute("SELECT 1 FROM pgjobs.jobs WHERE id = %s", [id]).fetchone() is not None


def count(conn: Conn, where: str = "true", params: Any = None) -> int:
    row = conn.execute(f"SELECT count(*) FROM pgjobs.jobs WHERE {where}", params).fetchone()  # type: ignore[arg-type]
    assert row is not None
    return int(row[0])


def claim_index_visits(conn: Conn) -> int:
    """Index entries this backend's scans of the two claim indexes returned (live or dead), this transaction
    included: the difference across a claim is what it walked."""
    row = conn.execute(
        "SELECT pg_stat_get_xact_tuples_returned('pgjobs.jobs_pending_idx'::regclass)"
        " + pg_stat_get_xact_tuples_returned('pgjobs.jobs_active_idx'::regclass)"
    ).fetchone()
    assert row is not None
    return int(row[0])


@contextlib.contextmanager
def held_snapshot(connect: Callable[..., Conn]) -> Iterator[None]:
    """A foreign session idle in a transaction with a snapshot (``BEGIN; SELECT txid_current();`` and nothing
    more): what keeps every version newer than it, with no pruning, no VACUUM and no killed index entry."""
    h = connect()
    h.autocommit = False
    h.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    h.execute("SELECT txid_current()")
    try:
        yield
    finally:
        h.rollback()


def vacuum_clean(conn: Conn, *tables: str, within: float = 60.0) -> None:
    """VACUUMs each pgjobs table until it reports no dead tuple left behind. Any transaction with an xid that
    is still open in the cluster (another test's held snapshot, in another database too: every snapshot's xmin
    is cluster-wide) keeps the dead versions newer than it, and a test that counts what a claim reads after a
    VACUUM would count them."""
    deadline = time.monotonic() + within
    for table in tables:
        while True:
            said: list[str] = []

            def heard(d: psycopg.errors.Diagnostic, said: list[str] = said) -> None:
                said.append(d.message_primary or "")

            conn.add_notice_handler(heard)
            try:
                conn.execute(sql.SQL("VACUUM (VERBOSE) {}").format(sql.Identifier("pgjobs", table)))
            finally:
                conn.remove_notice_handler(heard)
            kept = [int(n) for m in said for n in re.findall(r"(\d+) are dead but not yet removable", m)]
            if kept and not any(kept):  # (a partitioned table: one report per partition)
                break
            assert time.monotonic() < deadline, f"VACUUM of {table} still keeps dead tuples: {said}"
            time.sleep(0.1)


def expire(conn: Conn, id: int) -> None:
    """Makes a leased job's lease lapse now (instead of sleeping through it)."""
    conn.execute("UPDATE pgjobs.jobs SET lease_expires_at = now() - interval '1 second' WHERE id = %s", [id])


def backdate(conn: Conn, id: int, age: str) -> None:
    """Moves a job's completed_at back by ``age`` (an interval literal)."""
    conn.execute("UPDATE pgjobs.jobs SET completed_at = completed_at - %s::interval WHERE id = %s", [age, id])


def snapshot(conn: Conn) -> dict[str, list[tuple[Any, ...]]]:
    """Every row pgjobs keeps, to prove that a refused call changed nothing."""
    tables = {"jobs": "id", "queues": "queue", "workers": "id", "batches": "id", "edges": "child_id, parent_job_id"}
    out: dict[str, list[tuple[Any, ...]]] = {}
    for table, order in tables.items():
        out[table] = [tuple(r) for r in conn.execute(f"SELECT * FROM pgjobs.{table} ORDER BY {order}").fetchall()]
    return out  # (the id sequence is not transactional: a refused call may leave a gap, by design)


@contextlib.contextmanager
def raises_pj(code: str, *fragments: str) -> Iterator[pytest.ExceptionInfo[psycopg.Error]]:
    """Expects a database error with SQLSTATE ``code`` whose message contains every fragment."""
    with pytest.raises(psycopg.Error) as info:
        yield info
    assert info.value.sqlstate == code, f"expected {code}, got {info.value.sqlstate}: {info.value}"
    message = info.value.diag.message_primary or ""
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


def listen(conn: Conn, *channels: str) -> None:
    for channel in channels:
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))


_FENCE = "pgjobs_test_fence"


def drain(conn: Conn, timeout: float = 15.0) -> list[tuple[str, str]]:
    """Every notification committed before this call, in order, without guessing a quiet window.

    NOTIFY delivers in commit order, so the listener commits a fence notification of its own and reads
    until the fence comes back: everything committed earlier (by any session) has arrived by then."""
    token = secrets.token_hex(8)
    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(_FENCE)))
    conn.execute("SELECT pg_notify(%s, %s)", [_FENCE, token])
    got: list[tuple[str, str]] = []
    for n in conn.notifies(timeout=timeout):
        if n.channel == _FENCE:
            if n.payload == token:
                return got
            continue
        got.append((n.channel, n.payload))
    raise AssertionError(f"the fence notification did not come back within {timeout} s; got {got}")


def status_events(notes: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """The pgjobs_status events among ``notes``, arrays flattened, in order."""
    out: list[dict[str, Any]] = []
    for channel, payload in notes:
        if channel != "pgjobs_status":
            continue
        value = json.loads(payload)
        out += value if isinstance(value, list) else [value]
    return out


def payloads(notes: list[tuple[str, str]], channel: str) -> list[str]:
    return [p for c, p in notes if c == channel]


def run_threads(n: int, target: Callable[[int], T], timeout: float = 60) -> list[T]:
    """Runs ``target(i)`` for i in range(n) on n threads started together; returns results, re-raises errors."""
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait(timeout)
            results[i] = target(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), "a racing thread hung"
    if errors:
        raise errors[0]
    return results


@pytest.fixture(scope="module")
def module_conn(pg_server_dsn: str, pg_template: str) -> Iterator[Conn]:
    """An autocommit connection to a database of its own for a whole module, cloned from the migrated
    template: for tests that prove a call changes nothing, which can therefore share it."""
    from conftest import db_dsn

    name = f"{pg_template}_m{secrets.token_hex(4)}"
    with psycopg.connect(pg_server_dsn, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(pg_template))
        )
    try:
        with psycopg.connect(db_dsn(pg_server_dsn, name), autocommit=True) as conn:
            yield conn
    finally:
        with psycopg.connect(pg_server_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

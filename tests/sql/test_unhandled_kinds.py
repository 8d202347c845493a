"""``unhandled_kinds``: claimable jobs no live worker takes, read from the live workers' heartbeat meta (the
queues and kinds a Python worker reports; a meta that does not say counts as taking anything)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.helpers.foundation import call, enqueue, raises_pj

Conn = psycopg.Connection[Any]


def _unhandled(conn: Conn, **kwargs: Any) -> set[tuple[str, str, int, bool]]:
    return {(r["queue"], r["kind"], r["jobs"], r["served"]) for r in call(conn, "unhandled_kinds", **kwargs)}


def _heartbeat(conn: Conn, worker: str, meta: dict[str, Any]) -> None:
    call(conn, "worker_heartbeat", worker=worker, meta=meta)


def test_kinds_no_live_worker_takes_are_listed_by_queue(conn: Conn) -> None:
    for kind, queue in [("known", "default"), ("mystery", "default"), ("mystery", "default"), ("known", "other")]:
        enqueue(conn, kind, queue=queue)
    enqueue(conn, "later", run_at="2999-01-01T00:00:00Z")  # not claimable yet: not listed
    # no worker at all: nothing is taken
    assert _unhandled(conn) == {
        ("default", "known", 1, False), ("default", "mystery", 2, False), ("other", "known", 1, False),
    }  # fmt: skip
    _heartbeat(conn, "py", {"queues": {"default": 4}, "kinds": ["known", "else"], "heartbeat_interval": 10})
    assert _unhandled(conn) == {("default", "mystery", 2, True), ("other", "known", 1, False)}
    assert _unhandled(conn, queues=["default"]) == {("default", "mystery", 2, True)}
    assert _unhandled(conn, queues=["nowhere"]) == set()
    # a worker reporting its queues as a list, and no kinds (another language's worker): takes any kind there
    _heartbeat(conn, "sql", {"queues": ["other"]})
    assert _unhandled(conn) == {("default", "mystery", 2, True)}
    _heartbeat(conn, "any", {"host": "h"})  # says nothing: may take anything
    assert _unhandled(conn) == set()


def test_stale_workers_do_not_count(conn: Conn) -> None:
    enqueue(conn, "known")
    _heartbeat(conn, "old", {"queues": {"default": 1}, "kinds": ["known"], "heartbeat_interval": 1})
    assert _unhandled(conn) == set()
    conn.execute("UPDATE pgjobs.workers SET last_seen = now() - interval '4 seconds'")  # three intervals missed
    assert _unhandled(conn) == {("default", "known", 1, False)}


def test_due_scheduled_jobs_count_and_the_head_read_is_bounded(conn: Conn) -> None:
    enqueue(conn, "retried", run_at="2999-01-01T00:00:00Z")
    conn.execute("UPDATE pgjobs.jobs SET run_at = now() - interval '1 minute'")  # due, still 'scheduled'
    call(conn, "enqueue_many", jobs=[{"kind": "bulk"} for _ in range(30)])
    assert _unhandled(conn, sample=10) == {("default", "retried", 1, False), ("default", "bulk", 10, False)}
    assert _unhandled(conn) == {("default", "retried", 1, False), ("default", "bulk", 30, False)}


@pytest.mark.parametrize(("sample", "says"), [(0, "got 0"), (100001, "got 100001"), (None, "got NULL")])
def test_bad_arguments_are_pj002(conn: Conn, sample: Any, says: str) -> None:
    with raises_pj("PJ002", "sample must be between 1 and 100000", says):
        call(conn, "unhandled_kinds", sample=sample)
    with raises_pj("PJ002", "queues must be a one-dimensional array"):
        conn.execute("SELECT * FROM pgjobs.unhandled_kinds(queues => '{{a},{b}}'::text[])")

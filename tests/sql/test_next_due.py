"""``next_due_within``: what the worker's poller asks (sql/claim.sql), and why it is not ``next_due_at``.

The poller sleeps until the next due ``run_at`` or lease expiry, or its poll interval, whichever comes first.
``next_due_at`` takes a ``min()`` over ``jobs_active_idx`` from its front, which under a held snapshot holds
the old entry of every job completed since; ``next_due_within`` reads only the entries that fall due in the
window.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest
from conftest import ConnectFactory

from tests.helpers.foundation import claim, enqueue, enqueue_n, held_snapshot, scalar

Conn = psycopg.Connection[Any]


def due(conn: Conn, queues: list[str], within: str) -> Any:
    return scalar(conn, "next_due_within", queues=queues, within=within)


def test_it_gives_the_earliest_run_at_or_lease_expiry_inside_the_window_only(conn: Conn) -> None:
    assert due(conn, ["q"], "1 hour") is None
    sched = enqueue(conn, queue="q", run_at="2999-01-01T00:00:00Z")["id"]
    assert due(conn, ["q"], "1 hour") is None, "a run_at beyond the window"
    conn.execute("UPDATE pgjobs.jobs SET run_at = now() + interval '10 minutes' WHERE id = %s", [sched])
    in_ten = due(conn, ["q"], "1 hour")
    assert in_ten is not None and in_ten == scalar(conn, "next_due_at", queues=["q"])
    enqueue(conn, queue="q2")
    lease = claim(conn, "w", queues=["q2"], lease="2 minutes")[0]
    assert due(conn, ["q", "q2"], "1 hour") == lease["lease_expires_at"]
    assert due(conn, ["q"], "1 hour") == in_ten, "another queue's lease is not this one's business"
    assert due(conn, ["q", "q2"], "1 minute") is None
    # overdue: the claims take it and the poller wakes at its interval anyway; next_due_at still reports it
    conn.execute("UPDATE pgjobs.jobs SET lease_expires_at = now() - interval '1 second' WHERE id = %s", [lease["id"]])
    assert due(conn, ["q2"], "1 hour") is None
    assert scalar(conn, "next_due_at", queues=["q2"]) is not None


@pytest.mark.parametrize("within", ["0 seconds", "-1 second", "101 years", "100000000 years"])
def test_a_window_that_is_not_positive_is_refused(conn: Conn, within: str) -> None:
    with pytest.raises(psycopg.Error) as err:
        due(conn, ["q"], within)
    assert err.value.sqlstate == "PJ002"
    assert "within must be a positive interval of at most 100 years" in str(err.value)


def test_under_a_held_snapshot_it_reads_no_completed_jobs_lease_entries(conn: Conn, connect: ConnectFactory) -> None:
    """1,000 jobs claimed and completed under a held snapshot: next_due_at walks their 1,000 dead lease entries
    before it reaches the live job's, next_due_within (whose window starts now) none of them."""
    worker = connect()
    enqueue_n(worker, 1001, queue="q")
    conn.execute("ANALYZE pgjobs.jobs")
    with held_snapshot(connect):
        for _ in range(20):
            got = claim(worker, "w", queues=["q"], max_jobs=50, lease="1 second")
            scalar(worker, "complete_many", ids=[g["id"] for g in got], lease_tokens=[g["lease_token"] for g in got])
        time.sleep(1.1)  # their (dead) lease entries now sort before now(), before the live job's
        last = claim(worker, "w", queues=["q"], max_jobs=1, lease="20 seconds")[0]
        visited = {}
        for name, sql, arg in (
            ("at", "SELECT pgjobs.next_due_at(%s::text[])", None),
            ("within", "SELECT pgjobs.next_due_within(%s::text[], %s::interval)", "1 minute"),
        ):
            with conn.transaction():
                before = entries(conn)
                row = conn.execute(sql, [["q"], arg] if arg else [["q"]]).fetchone()
                assert row is not None and row[0] == last["lease_expires_at"]
                visited[name] = entries(conn) - before
    assert visited["at"] >= 1000, visited
    assert visited["within"] <= 10, visited


def entries(conn: Conn) -> int:
    """Index entries of jobs_active_idx this transaction's scans returned (live or dead)."""
    row = conn.execute("SELECT pg_stat_get_xact_tuples_returned('pgjobs.jobs_active_idx'::regclass)").fetchone()
    assert row is not None
    return int(row[0])

"""Managing work: cancel, retry, delete, purge, configure_queue."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from conftest import ConnectFactory

from tests.helpers.foundation import (
    backdate,
    call,
    claim,
    claim_one,
    count,
    drain,
    enqueue,
    exists,
    job,
    listen,
    payloads,
    raises_pj,
    scalar,
    snapshot,
)

Conn = psycopg.Connection[Any]
FUTURE = datetime.now(UTC) + timedelta(days=1)


def in_state(conn: Conn, state: str, **kwargs: Any) -> int:
    """A job in ``state``, reached through the contract (waiting: set directly, the graph issue owns it)."""
    if state == "scheduled":
        return int(enqueue(conn, run_at=FUTURE, **kwargs)["id"])
    jid = int(enqueue(conn, **kwargs)["id"])
    if state == "pending":
        return jid
    if state == "waiting":
        conn.execute("UPDATE pgjobs.jobs SET state = 'waiting', remaining_deps = 1 WHERE id = %s", [jid])
        return jid
    conn.execute("UPDATE pgjobs.jobs SET priority = -32768 WHERE id = %s", [jid])  # claim this one next
    c = claim_one(conn, queues=[kwargs.get("queue", "default")])
    assert c["id"] == jid
    if state == "succeeded":
        assert scalar(conn, "complete", id=jid, lease_token=c["lease_token"]) is True
    elif state == "failed":
        assert scalar(conn, "dead_letter", id=jid, lease_token=c["lease_token"], error="boom") is True
    elif state == "cancelled":
        assert scalar(conn, "cancel", id=jid) is True
        assert scalar(conn, "fail", id=jid, lease_token=c["lease_token"], error="cancelled") == "cancelled"
    else:
        assert state == "active"
    return jid


@pytest.mark.smoke
def test_cancel_a_job_not_yet_running(conn: Conn) -> None:
    for state in ("waiting", "scheduled", "pending"):
        jid = in_state(conn, state)
        assert scalar(conn, "cancel", id=jid) is True, state
        row = job(conn, jid)
        assert row["state"] == "cancelled" and row["completed_at"] is not None, state
        assert claim(conn) == [], state


def test_cancel_a_running_job_requests_it_and_tells_the_worker(connect: ConnectFactory) -> None:
    conn = connect()
    listener = connect()
    jid = in_state(conn, "active")
    listen(listener, "pgjobs_cancel")
    assert scalar(conn, "cancel", id=jid) is True
    row = job(conn, jid)
    assert row["state"] == "active" and row["cancel_requested"] is True
    assert payloads(drain(listener), "pgjobs_cancel") == [str(jid)]
    # the worker then ends it as cancelled
    token = row["lease_token"]
    assert scalar(conn, "release", id=jid, lease_token=token) is True
    assert job(conn, jid)["state"] == "cancelled"


def test_a_worker_acknowledges_a_cancellation(conn: Conn) -> None:
    jid = in_state(conn, "active")
    token = job(conn, jid)["lease_token"]
    scalar(conn, "cancel", id=jid)
    assert scalar(conn, "ack_cancel", id=jid, lease_token=token) is True
    assert job(conn, jid)["state"] == "cancelled"


def test_cancel_a_finished_job_returns_false_and_changes_nothing(conn: Conn) -> None:
    for state in ("succeeded", "failed", "cancelled"):
        jid = in_state(conn, state)
        before = snapshot(conn)
        assert scalar(conn, "cancel", id=jid) is False, state
        assert snapshot(conn) == before, state


def test_cancel_an_unknown_job_raises_pj003(conn: Conn) -> None:
    with raises_pj("PJ003", "424242"):
        scalar(conn, "cancel", id=424242)


@pytest.mark.parametrize("state", ["failed", "cancelled"])
def test_retry_makes_a_failed_or_cancelled_job_pending(connect: ConnectFactory, state: str) -> None:
    conn = connect()
    listener = connect()
    jid = in_state(conn, state, max_attempts=1)
    listen(listener, "pgjobs_wake")
    assert scalar(conn, "retry", id=jid) is True
    row = job(conn, jid)
    assert row["state"] == "pending" and row["completed_at"] is None and row["cancel_requested"] is False
    assert payloads(drain(listener), "pgjobs_wake") == ["default"]
    c = claim_one(conn)
    assert c["id"] == jid and c["attempt"] <= c["max_attempts"]
    assert scalar(conn, "complete", id=jid, lease_token=c["lease_token"]) is True


def test_retry_of_any_other_state_raises_pj004(conn: Conn) -> None:
    for state in ("waiting", "scheduled", "pending", "active", "succeeded"):
        jid = in_state(conn, state)
        before = snapshot(conn)
        with raises_pj("PJ004", str(jid), state):
            scalar(conn, "retry", id=jid)
        assert snapshot(conn) == before, state


def test_retry_of_an_unknown_job_raises_pj003(conn: Conn) -> None:
    with raises_pj("PJ003", "99"):
        scalar(conn, "retry", id=99)


def test_retry_when_another_live_job_holds_the_key_raises_pj004(conn: Conn) -> None:
    jid = in_state(conn, "failed", unique_key="k", unique_live_only=True)
    enqueue(conn, unique_key="k", unique_live_only=True)
    before = snapshot(conn)
    with raises_pj("PJ004", str(jid)):
        scalar(conn, "retry", id=jid)
    assert snapshot(conn) == before


def test_retry_into_a_full_queue_raises_pj001(conn: Conn) -> None:
    jid = in_state(conn, "failed", queue="b")
    call(conn, "configure_queue", queue="b", max_length=1)
    enqueue(conn, queue="b")
    before = snapshot(conn)
    with raises_pj("PJ001", "b"):
        scalar(conn, "retry", id=jid)
    assert snapshot(conn) == before


def test_delete_removes_a_finished_job(conn: Conn) -> None:
    for state in ("succeeded", "failed", "cancelled"):
        jid = in_state(conn, state)
        assert scalar(conn, "delete", id=jid) is True, state
        assert not exists(conn, jid), state


def test_delete_of_a_live_job_raises_pj004(conn: Conn) -> None:
    for state in ("waiting", "scheduled", "pending", "active"):
        jid = in_state(conn, state)
        before = snapshot(conn)
        with raises_pj("PJ004", str(jid), state):
            scalar(conn, "delete", id=jid)
        assert snapshot(conn) == before, state


def test_delete_of_an_unknown_job_raises_pj003(conn: Conn) -> None:
    with raises_pj("PJ003", "77"):
        scalar(conn, "delete", id=77)


@pytest.mark.smoke
def test_purge_removes_finished_jobs_by_age(conn: Conn) -> None:
    old_ok = in_state(conn, "succeeded")
    new_ok = in_state(conn, "succeeded")
    old_failed = in_state(conn, "failed")
    old_cancelled = in_state(conn, "cancelled")
    new_failed = in_state(conn, "failed")
    live = [in_state(conn, s) for s in ("pending", "scheduled", "active")]
    for jid in (old_ok, old_failed, old_cancelled):
        backdate(conn, jid, "2 days")
    conn.execute("UPDATE pgjobs.jobs SET created_at = created_at - interval '30 days'")  # age is completion age
    assert scalar(conn, "purge", succeeded_before=timedelta(days=1), failed_before=timedelta(days=1)) == 3
    remaining = {r[0] for r in conn.execute("SELECT id FROM pgjobs.jobs")}
    assert remaining == {new_ok, new_failed, *live}


def test_purge_ages_apply_per_class(conn: Conn) -> None:
    ok = in_state(conn, "succeeded")
    failed = in_state(conn, "failed")
    cancelled = in_state(conn, "cancelled")
    for jid in (ok, failed, cancelled):
        backdate(conn, jid, "3 hours")
    # failed_before covers failed and cancelled; NULL keeps a class
    assert scalar(conn, "purge", succeeded_before=timedelta(days=1), failed_before=timedelta(hours=1)) == 2
    assert {r[0] for r in conn.execute("SELECT id FROM pgjobs.jobs")} == {ok}
    assert scalar(conn, "purge", succeeded_before=None, failed_before=timedelta(0)) == 0
    assert scalar(conn, "purge", succeeded_before=timedelta(hours=1), failed_before=None) == 1
    assert count(conn) == 0


@pytest.mark.smoke
def test_configure_queue_null_leaves_a_setting_and_zero_removes_a_limit(conn: Conn) -> None:
    first = call(conn, "configure_queue", queue="q", max_length=10, max_active=4, max_active_per_group=2)[0]
    assert (first["max_length"], first["max_active"], first["max_active_per_group"]) == (10, 4, 2)
    assert (first["paused"], first["fair"], first["noisy_share"], first["noisy_min_active"]) == (False, False, 0.5, 2)
    assert first["status_events"] == "all"
    second = call(
        conn,
        "configure_queue",
        queue="q",
        paused=True,
        fair=True,
        noisy_share=0.25,
        noisy_min_active=3,
        status_events="terminal",
    )[0]
    assert (second["max_length"], second["max_active"], second["max_active_per_group"]) == (10, 4, 2)
    assert (second["paused"], second["fair"], second["noisy_share"], second["noisy_min_active"]) == (
        True,
        True,
        0.25,
        3,
    )
    assert second["status_events"] == "terminal"
    third = call(conn, "configure_queue", queue="q", max_length=0, max_active=0, max_active_per_group=0, paused=False)[
        0
    ]
    assert (third["max_length"], third["max_active"], third["max_active_per_group"], third["paused"]) == (
        None,
        None,
        None,
        False,
    )
    assert third["fair"] is True and third["status_events"] == "terminal"
    stored = conn.execute("SELECT max_length, paused, fair FROM pgjobs.queues WHERE queue = 'q'").fetchone()
    assert stored == (None, False, True)


def test_unconfigured_queues_are_unbounded_unpaused_and_not_fair(conn: Conn) -> None:
    for _ in range(5):
        enqueue(conn, queue="fresh")
    assert len(claim(conn, queues=["fresh"], max_jobs=10)) == 5
    assert conn.execute("SELECT count(*) FROM pgjobs.queues WHERE queue = 'fresh'").fetchone() == (0,)


def test_resuming_a_paused_queue_wakes_workers(connect: ConnectFactory) -> None:
    conn = connect()
    listener = connect()
    call(conn, "configure_queue", queue="q", paused=True)
    listen(listener, "pgjobs_wake")
    call(conn, "configure_queue", queue="q", paused=False)
    assert payloads(drain(listener), "pgjobs_wake") == ["q"]

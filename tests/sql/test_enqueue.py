"""Producing work: pgjobs.enqueue and pgjobs.enqueue_many (idempotency, single-flight, bounded queues)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from conftest import ConnectFactory

from tests.helpers.foundation import (
    call,
    claim_one,
    count,
    drain,
    enqueue,
    job,
    listen,
    raises_pj,
    run_threads,
    scalar,
    snapshot,
)

Conn = psycopg.Connection[Any]


@pytest.mark.smoke
def test_enqueue_defaults(conn: Conn) -> None:
    got = enqueue(conn, "send_email")
    assert got["created"] is True and got["state"] == "pending"
    row = job(conn, got["id"])
    assert row["kind"] == "send_email"
    assert row["payload"] == {} and row["meta"] == {}
    assert row["queue"] == "default" and row["state"] == "pending"
    assert row["priority"] == 0 and row["max_attempts"] == 20 and row["attempt"] == 0
    assert row["unique_key"] is None and row["group_key"] is None and row["batch_id"] is None
    assert row["lease_token"] is None and row["completed_at"] is None and row["cancel_requested"] is False
    now = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    assert row["run_at"] <= now and row["created_at"] <= now


def test_enqueue_stores_every_argument(conn: Conn) -> None:
    got = enqueue(
        conn,
        "resize",
        payload={"w": 100, "tags": ["a"]},
        queue="images",
        priority=-5,
        max_attempts=3,
        unique_key="img-1",
        group_key="tenant-9",
        meta={"trace": "abc"},
    )
    row = job(conn, got["id"])
    assert (row["payload"], row["queue"], row["priority"], row["max_attempts"]) == (
        {"w": 100, "tags": ["a"]},
        "images",
        -5,
        3,
    )
    assert (row["unique_key"], row["group_key"], row["meta"]) == ("img-1", "tenant-9", {"trace": "abc"})


def test_json_null_payload_is_refused_as_a_payload_that_is_not_an_object(conn: Conn) -> None:
    with raises_pj("PJ002", "payload must be a JSON object", "null"):
        conn.execute("SELECT id FROM pgjobs.enqueue(kind => 'k', payload => 'null'::jsonb)")


def test_run_at_in_the_future_is_scheduled_and_in_the_past_is_pending(conn: Conn) -> None:
    later = datetime.now(UTC) + timedelta(hours=1)
    earlier = datetime(2020, 1, 1, tzinfo=UTC)
    s = enqueue(conn, run_at=later)
    p = enqueue(conn, run_at=earlier)
    assert s["state"] == "scheduled" and job(conn, s["id"])["run_at"] == later
    assert p["state"] == "pending" and job(conn, p["id"])["run_at"] == earlier


def test_unique_key_returns_the_existing_job(conn: Conn) -> None:
    first = enqueue(conn, "report", unique_key="2026-11", payload={"v": 1})
    again = enqueue(conn, "report", unique_key="2026-11", payload={"v": 2})
    assert again == {"id": first["id"], "created": False, "state": "pending"}
    assert job(conn, first["id"])["payload"] == {"v": 1}  # the second call changed nothing
    assert count(conn) == 1
    # the key is per kind
    other = enqueue(conn, "invoice", unique_key="2026-11")
    assert other["created"] is True and other["id"] != first["id"]


def test_unique_key_holds_after_the_job_ends(conn: Conn) -> None:
    first = enqueue(conn, "once", unique_key="k")
    c = claim_one(conn)
    assert scalar(conn, "complete", id=c["id"], lease_token=c["lease_token"]) is True
    again = enqueue(conn, "once", unique_key="k")
    assert again == {"id": first["id"], "created": False, "state": "succeeded"}


@pytest.mark.smoke
def test_eight_threads_racing_one_unique_key_make_exactly_one_job(connect: ConnectFactory) -> None:
    conns = [connect() for _ in range(8)]
    results = run_threads(8, lambda i: enqueue(conns[i], "race", unique_key="the-key", payload={"by": i}))
    ids = {r["id"] for r in results}
    assert len(ids) == 1
    assert sum(r["created"] for r in results) == 1
    assert count(conns[0], "kind = 'race'") == 1


def test_enqueue_many_racing_on_shared_unique_keys(connect: ConnectFactory) -> None:
    conns = [connect() for _ in range(6)]

    def batch(i: int) -> list[dict[str, Any]]:
        keys = ["shared-a", f"own-{i}", "shared-b"]
        return call(conns[i], "enqueue_many", jobs=[{"kind": "race", "unique_key": k, "ref": k} for k in keys])

    results = run_threads(6, batch)
    for key in ("shared-a", "shared-b"):
        rows = [r for res in results for r in res if r["ref"] == key]
        assert len({r["id"] for r in rows}) == 1 and sum(r["created"] for r in rows) == 1, key
    assert count(conns[0], "kind = 'race'") == 2 + 6


def test_racing_unique_key_inside_open_transactions(connect: ConnectFactory) -> None:
    """The loser waits on the winner's uncommitted row, then returns it once it commits."""
    conns = [connect(autocommit=False) for _ in range(4)]

    def enqueue_and_commit(i: int) -> dict[str, Any]:
        with conns[i].transaction():
            got = enqueue(conns[i], "race", unique_key="tx-key")
        return got

    results = run_threads(4, enqueue_and_commit)
    assert len({r["id"] for r in results}) == 1
    assert sum(r["created"] for r in results) == 1


def test_a_rolled_back_holder_frees_the_key(connect: ConnectFactory) -> None:
    a = connect(autocommit=False)
    b = connect()
    enqueue(a, "race", unique_key="rb")
    a.rollback()
    got = enqueue(b, "race", unique_key="rb")
    assert got["created"] is True


def test_single_flight_blocks_only_while_the_holder_is_live(conn: Conn) -> None:
    holder = enqueue(conn, "sync", unique_key="acct-1", unique_live_only=True)
    again = enqueue(conn, "sync", unique_key="acct-1", unique_live_only=True)
    assert again == {"id": holder["id"], "created": False, "state": "pending"}
    c = claim_one(conn)
    assert enqueue(conn, "sync", unique_key="acct-1", unique_live_only=True)["id"] == holder["id"]  # active: held
    assert scalar(conn, "complete", id=c["id"], lease_token=c["lease_token"]) is True
    fresh = enqueue(conn, "sync", unique_key="acct-1", unique_live_only=True)
    assert fresh["created"] is True and fresh["id"] != holder["id"]
    # failed and cancelled holders free it too
    assert scalar(conn, "cancel", id=fresh["id"]) is True
    third = enqueue(conn, "sync", unique_key="acct-1", unique_live_only=True)
    assert third["created"] is True
    c = claim_one(conn)
    assert scalar(conn, "dead_letter", id=c["id"], lease_token=c["lease_token"], error="boom") is True
    assert enqueue(conn, "sync", unique_key="acct-1", unique_live_only=True)["created"] is True


def test_single_flight_race_after_the_holder_ends(connect: ConnectFactory) -> None:
    setup = connect()
    enqueue(setup, "sync", unique_key="sf", unique_live_only=True)
    c = claim_one(setup)
    assert scalar(setup, "complete", id=c["id"], lease_token=c["lease_token"]) is True
    conns = [connect() for _ in range(8)]
    results = run_threads(8, lambda i: enqueue(conns[i], "sync", unique_key="sf", unique_live_only=True))
    assert len({r["id"] for r in results}) == 1 and sum(r["created"] for r in results) == 1
    assert count(setup, "kind = 'sync' AND state = 'pending'") == 1


def test_a_permanent_key_blocks_a_later_single_flight_enqueue(conn: Conn) -> None:
    holder = enqueue(conn, "k", unique_key="x")
    c = claim_one(conn)
    scalar(conn, "complete", id=c["id"], lease_token=c["lease_token"])
    assert enqueue(conn, "k", unique_key="x", unique_live_only=True) == {
        "id": holder["id"],
        "created": False,
        "state": "succeeded",
    }


@pytest.mark.smoke
def test_full_queue_refuses_with_pj001_but_an_existing_key_still_answers(conn: Conn) -> None:
    call(conn, "configure_queue", queue="small", max_length=2)
    a = enqueue(conn, "k", queue="small", unique_key="a")
    enqueue(conn, "k", queue="small")
    before = snapshot(conn)
    with raises_pj("PJ001", "small", "2"):
        enqueue(conn, "k", queue="small")
    assert snapshot(conn) == before
    # idempotency first, capacity second
    assert enqueue(conn, "k", queue="small", unique_key="a") == {"id": a["id"], "created": False, "state": "pending"}
    # other queues are not affected
    assert enqueue(conn, "k", queue="other")["created"] is True


def test_max_length_counts_only_live_jobs(conn: Conn) -> None:
    call(conn, "configure_queue", queue="q", max_length=1)
    enqueue(conn, queue="q", run_at=datetime.now(UTC) + timedelta(hours=1))  # scheduled counts
    with raises_pj("PJ001"):
        enqueue(conn, queue="q")
    jid = conn.execute("SELECT id FROM pgjobs.jobs").fetchone()[0]  # type: ignore[index]
    assert scalar(conn, "cancel", id=jid) is True  # terminal no longer counts
    assert enqueue(conn, queue="q")["created"] is True
    c = claim_one(conn, queues=["q"])  # active counts
    with raises_pj("PJ001"):
        enqueue(conn, queue="q")
    scalar(conn, "complete", id=c["id"], lease_token=c["lease_token"])
    assert enqueue(conn, queue="q")["created"] is True
    # 0 removes the limit
    call(conn, "configure_queue", queue="q", max_length=0)
    for _ in range(3):
        enqueue(conn, queue="q")


def test_racing_for_the_last_free_slots_never_exceeds_max_length(connect: ConnectFactory) -> None:
    setup = connect()
    call(setup, "configure_queue", queue="bounded", max_length=5)
    enqueue(setup, queue="bounded")
    enqueue(setup, queue="bounded")
    conns = [connect() for _ in range(8)]

    def attempt(i: int) -> str:
        try:
            if i % 2:
                enqueue(conns[i], "k", queue="bounded")
            else:
                call(conns[i], "enqueue_many", jobs=[{"kind": "k", "queue": "bounded"}])
            return "created"
        except psycopg.Error as exc:
            assert exc.sqlstate == "PJ001", exc
            return "full"

    outcomes = run_threads(8, attempt)
    assert outcomes.count("created") == 3
    assert count(setup, "queue = 'bounded'") == 5


def test_a_rolled_back_enqueue_leaves_no_job_and_sends_nothing(connect: ConnectFactory) -> None:
    listener = connect()
    listen(listener, "pgjobs_wake", "pgjobs_status")
    producer = connect(autocommit=False)
    got = enqueue(producer, "ghost", unique_key="g")
    producer.rollback()
    assert drain(listener) == []
    assert count(listener) == 0
    assert listener.execute("SELECT count(*) FROM pgjobs.job_status(id => %s)", [got["id"]]).fetchone() == (0,)


def test_enqueue_joins_the_callers_transaction(connect: ConnectFactory) -> None:
    producer = connect(autocommit=False)
    other = connect()
    got = enqueue(producer, "tx")
    assert count(other) == 0  # not visible before commit
    producer.commit()
    assert count(other) == 1 and job(other, got["id"])["kind"] == "tx"


# ---------------------------------------------------------------------------------------------- enqueue_many


@pytest.mark.smoke
def test_enqueue_many_returns_one_row_per_spec_in_order(conn: Conn) -> None:
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    rows = call(
        conn,
        "enqueue_many",
        jobs=[
            {"kind": "a", "ref": "first", "payload": {"n": 1}},
            {"kind": "b", "ref": "second", "queue": "q2", "priority": 3, "run_at": later},
            {"kind": "c", "max_attempts": 2, "meta": {"m": 1}, "group_key": "g"},
        ],
    )
    assert [r["ref"] for r in rows] == ["first", "second", None]
    assert all(r["created"] and r["batch_id"] is None for r in rows)
    a, b, c = (job(conn, r["id"]) for r in rows)
    assert (a["kind"], a["payload"], a["state"]) == ("a", {"n": 1}, "pending")
    assert (b["queue"], b["priority"], b["state"]) == ("q2", 3, "scheduled")
    assert (c["max_attempts"], c["meta"], c["group_key"]) == (2, {"m": 1}, "g")
    assert rows[0]["id"] < rows[1]["id"] < rows[2]["id"]


def test_enqueue_many_unique_keys_existing_and_repeated(conn: Conn) -> None:
    held = enqueue(conn, "k", unique_key="u1")
    rows = call(
        conn,
        "enqueue_many",
        jobs=[
            {"kind": "k", "unique_key": "u1", "ref": "old"},
            {"kind": "k", "unique_key": "u2", "ref": "new"},
            {"kind": "k", "unique_key": "u2", "ref": "dup"},
        ],
    )
    by_ref = {r["ref"]: r for r in rows}
    assert by_ref["old"]["id"] == held["id"] and by_ref["old"]["created"] is False
    assert by_ref["new"]["created"] is True
    assert by_ref["dup"]["id"] == by_ref["new"]["id"] and by_ref["dup"]["created"] is False
    assert count(conn) == 2


def test_enqueue_many_is_all_or_nothing(conn: Conn) -> None:
    before = snapshot(conn)
    with raises_pj("PJ002", "jobs[2]", "max_attempts"):
        call(conn, "enqueue_many", jobs=[{"kind": "a"}, {"kind": "b"}, {"kind": "c", "max_attempts": 0}])
    assert snapshot(conn) == before


def test_enqueue_many_on_a_bounded_queue(conn: Conn) -> None:
    call(conn, "configure_queue", queue="default", max_length=3)
    enqueue(conn, "k", unique_key="held")
    before = snapshot(conn)
    # an omitted queue and an explicit 'default' are one queue: 1 live + 3 > 3
    with raises_pj("PJ001", "default"):
        call(conn, "enqueue_many", jobs=[{"kind": "k"}, {"kind": "k", "queue": "default"}, {"kind": "k"}])
    assert snapshot(conn) == before
    # a held key does not need room, a key repeated in the call needs it once
    rows = call(
        conn,
        "enqueue_many",
        jobs=[
            {"kind": "k", "unique_key": "held"},
            {"kind": "k", "unique_key": "n"},
            {"kind": "k", "unique_key": "n"},
            {"kind": "k", "queue": "default"},
        ],
    )
    assert [r["created"] for r in rows] == [False, True, False, True]
    assert count(conn, "state = 'pending'") == 3


def test_enqueue_many_accepts_integral_json_numbers(conn: Conn) -> None:
    conn.execute("SELECT pgjobs.configure_queue(queue => 'q')")
    rows = conn.execute(
        'SELECT id FROM pgjobs.enqueue_many(jobs => \'[{"kind": "k", "priority": 5.0, "max_attempts": 3.0}]\')'
    ).fetchall()
    row = job(conn, rows[0][0])
    assert (row["priority"], row["max_attempts"]) == (5, 3)


def test_enqueue_many_empty_array_does_nothing(conn: Conn) -> None:
    assert call(conn, "enqueue_many", jobs=[]) == []
    assert count(conn) == 0


def test_enqueue_many_numeric_and_null_refs(conn: Conn) -> None:
    rows = call(conn, "enqueue_many", jobs=[{"kind": "k", "ref": 7}, {"kind": "k", "ref": None}])
    assert [r["ref"] for r in rows] == ["7", None]

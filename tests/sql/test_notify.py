"""Notifications: pgjobs_wake, pgjobs_cancel, delivery on commit; and the status events that used to be
pgjobs_status payloads, now read from the durable log (read_events), with pgjobs_status a hint only."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from conftest import ConnectFactory

from tests.helpers.foundation import (
    call,
    claim,
    claim_one,
    drain,
    enqueue,
    listen,
    payloads,
    scalar,
)

Conn = psycopg.Connection[Any]
KEYS = {"id", "state", "queue", "kind", "attempt", "batch_id"}
CHANNELS = ("pgjobs_wake", "pgjobs_status", "pgjobs_cancel")


@pytest.fixture
def pair(connect: ConnectFactory) -> tuple[Conn, Conn]:
    """(actor, listener): the listener hears every pgjobs channel."""
    actor, listener = connect(), connect()
    listen(listener, *CHANNELS)
    return actor, listener


def event(id: int, state: str, attempt: int, kind: str = "k", queue: str = "default") -> dict[str, Any]:
    return {"id": id, "state": state, "queue": queue, "kind": kind, "attempt": attempt, "batch_id": None}


def status_events(conn: Conn, after: int = 0) -> list[dict[str, Any]]:
    """The logged status events after ``after``, in the shape the notifications had."""
    return [{k: r[k] for k in KEYS} for r in call(conn, "read_events", after_id=after, max_rows=100_000)]


def newest(conn: Conn) -> int:
    """The newest event id; the reads leave the stream followed by an idle follower (hints are sent)."""
    rows = call(conn, "read_events", after_id=0, max_rows=100_000)
    head = int(rows[-1]["event_id"]) if rows else 0
    assert call(conn, "read_events", after_id=head) == []  # an empty read: the follower waits for a hint
    return head


@pytest.mark.smoke
def test_notifications_arrive_only_after_commit(connect: ConnectFactory) -> None:
    listener = connect()
    listen(listener, *CHANNELS)
    producer = connect(autocommit=False)
    jid = enqueue(producer, "k", queue="mail")["id"]
    assert drain(listener) == [] and status_events(listener) == []  # persisted first ...
    producer.commit()
    notes = drain(listener)  # ... pushed second
    assert payloads(notes, "pgjobs_wake") == ["mail"]
    assert status_events(listener) == [event(jid, "pending", 0, queue="mail")]


@pytest.mark.smoke
def test_every_transition_logs_a_status_event_of_the_contract_shape(pair: tuple[Conn, Conn]) -> None:
    conn, listener = pair
    jid = enqueue(conn, "k", max_attempts=3)["id"]
    c = claim_one(conn)
    scalar(conn, "progress", id=jid, lease_token=c["lease_token"], progress={"big": "x" * 3000})
    scalar(conn, "fail", id=jid, lease_token=c["lease_token"], error="e", retry_at=datetime.now(UTC))
    c = claim_one(conn)
    scalar(conn, "release", id=jid, lease_token=c["lease_token"])
    c = claim_one(conn)
    scalar(conn, "complete", id=jid, lease_token=c["lease_token"])
    events = status_events(listener)
    assert events == [
        event(jid, "pending", 0),
        event(jid, "active", 1),
        event(jid, "active", 1),  # the progress report
        event(jid, "pending", 1),
        event(jid, "active", 2),
        event(jid, "pending", 1),  # release gave the attempt back
        event(jid, "active", 2),
        event(jid, "succeeded", 2),
    ]


def test_terminal_transitions_log_status_events(pair: tuple[Conn, Conn]) -> None:
    conn, listener = pair
    a = enqueue(conn)["id"]
    b = enqueue(conn, run_at=datetime.now(UTC) + timedelta(hours=1))["id"]
    c = claim_one(conn)
    scalar(conn, "dead_letter", id=a, lease_token=c["lease_token"], error="x")
    scalar(conn, "cancel", id=b)
    scalar(conn, "retry", id=a)
    events = status_events(listener)
    assert events == [
        event(a, "pending", 0),
        event(b, "scheduled", 0),
        event(a, "active", 1),
        event(a, "failed", 1),
        event(b, "cancelled", 0),
        event(a, "pending", 1),
    ]


def test_wake_is_sent_when_a_job_becomes_claimable_now(pair: tuple[Conn, Conn]) -> None:
    conn, listener = pair
    enqueue(conn, queue="q", run_at=datetime.now(UTC) + timedelta(hours=1))
    assert payloads(drain(listener), "pgjobs_wake") == []  # scheduled: not claimable now
    jid = enqueue(conn, queue="q", max_attempts=5)["id"]
    assert payloads(drain(listener), "pgjobs_wake") == ["q"]
    c = claim_one(conn, queues=["q"])
    assert payloads(drain(listener), "pgjobs_wake") == []
    scalar(conn, "fail", id=jid, lease_token=c["lease_token"], error="e", retry_at=datetime.now(UTC))
    assert payloads(drain(listener), "pgjobs_wake") == ["q"]
    c = claim_one(conn, queues=["q"])
    scalar(
        conn, "fail", id=jid, lease_token=c["lease_token"], error="e", retry_at=datetime.now(UTC) + timedelta(hours=1)
    )
    assert payloads(drain(listener), "pgjobs_wake") == []
    conn.execute("UPDATE pgjobs.jobs SET run_at = now() - interval '1 s' WHERE id = %s", [jid])
    c = claim_one(conn, queues=["q"])
    scalar(conn, "release", id=jid, lease_token=c["lease_token"])
    assert payloads(drain(listener), "pgjobs_wake") == ["q"]


def test_enqueue_many_sends_one_wake_per_queue_and_logs_one_event_per_job(pair: tuple[Conn, Conn]) -> None:
    conn, listener = pair
    rows = call(conn, "enqueue_many", jobs=[{"kind": "k", "queue": q} for q in ("a", "b", "a", "a", "b")])
    notes = drain(listener)
    assert sorted(payloads(notes, "pgjobs_wake")) == ["a", "b"]
    assert payloads(notes, "pgjobs_status") == []  # nobody follows the stream: no hint
    events = status_events(conn)
    assert [e["id"] for e in events] == [r["id"] for r in rows]
    assert {e["id"]: e["queue"] for e in events} == {r["id"]: q for r, q in zip(rows, "abaab", strict=True)}
    assert all(e["state"] == "pending" and e["attempt"] == 0 and e["batch_id"] is None for e in events)


def test_a_multi_job_claim_and_complete_many_coalesce_into_one_hint_each(pair: tuple[Conn, Conn]) -> None:
    conn, listener = pair
    call(conn, "enqueue_many", jobs=[{"kind": "k"} for _ in range(5)])
    seen = newest(conn)  # (an empty read marks the stream followed by an idle follower: hints are sent)
    drain(listener)
    got = claim(conn, max_jobs=5)
    notes = drain(listener)
    assert len(payloads(notes, "pgjobs_status")) == 1
    assert [(e["id"], e["state"], e["attempt"]) for e in status_events(conn, seen)] == [
        (g["id"], "active", 1) for g in got
    ]
    seen = newest(conn)
    drain(listener)
    scalar(conn, "complete_many", ids=[g["id"] for g in got], lease_tokens=[g["lease_token"] for g in got])
    notes = drain(listener)
    assert len(payloads(notes, "pgjobs_status")) == 1
    assert sorted(e["id"] for e in status_events(conn, seen)) == sorted(g["id"] for g in got)
    assert {e["state"] for e in status_events(conn, seen)} == {"succeeded"}


def test_status_events_terminal_and_none(pair: tuple[Conn, Conn]) -> None:
    conn, listener = pair
    call(conn, "configure_queue", queue="t", status_events="terminal")
    call(conn, "configure_queue", queue="n", status_events="none")
    drain(listener)
    for q in ("t", "n", "all"):
        jid = enqueue(conn, queue=q)["id"]
        c = claim_one(conn, queues=[q])
        scalar(conn, "progress", id=jid, lease_token=c["lease_token"], progress={})
        scalar(conn, "complete", id=jid, lease_token=c["lease_token"])
    notes = drain(listener)
    by_queue: dict[str, list[str]] = {}
    for e in status_events(conn):
        by_queue.setdefault(e["queue"], []).append(e["state"])
    assert by_queue == {"t": ["succeeded"], "all": ["pending", "active", "active", "succeeded"]}
    # the wake does not depend on status_events
    assert sorted(payloads(notes, "pgjobs_wake")) == ["all", "n", "t"]


def test_status_events_terminal_filters_inside_a_coalesced_call(pair: tuple[Conn, Conn]) -> None:
    conn, listener = pair
    call(conn, "configure_queue", queue="t", status_events="terminal")
    drain(listener)
    rows = call(conn, "enqueue_many", jobs=[{"kind": "k", "queue": q} for q in ("t", "all", "t")])
    events = status_events(conn)
    assert [e["id"] for e in events] == [rows[1]["id"]]


def test_cancel_of_a_running_job_sends_its_id_on_pgjobs_cancel(pair: tuple[Conn, Conn]) -> None:
    conn, listener = pair
    jid = enqueue(conn)["id"]
    claim_one(conn)
    drain(listener)
    assert scalar(conn, "cancel", id=jid) is True
    notes = drain(listener)
    assert payloads(notes, "pgjobs_cancel") == [str(jid)]
    assert [e["state"] for e in status_events(conn)] == ["pending", "active"]  # still active: no transition yet


def test_long_names_never_break_a_transition(pair: tuple[Conn, Conn]) -> None:
    """Regression: a long kind made pg_notify raise 'payload string too long' and failed the enqueue. The
    log has no payload limit (the names are kept whole) and the hint carries no names at all."""
    conn, listener = pair
    newest(conn)  # follow the stream, so hints are sent
    huge = "k" * 1000  # the longest kind there is (limits: sql/checks.sql)
    jid = enqueue(conn, huge)["id"]
    events = status_events(conn)
    assert [(e["id"], e["kind"]) for e in events] == [(jid, huge)]
    call(conn, "enqueue_many", jobs=[{"kind": "x" * 300, "queue": "q" * 200} for _ in range(100)])
    got = claim(conn, queues=["q" * 200], max_jobs=100)
    assert len(got) == 100
    notes = drain(listener)
    hints = payloads(notes, "pgjobs_status")
    assert hints and all(len(p.encode()) < 100 for p in hints)
    claimed_events = [e for e in status_events(conn) if e["state"] == "active"]
    assert sorted(e["id"] for e in claimed_events) == sorted(g["id"] for g in got)


def test_a_bulk_enqueue_logs_each_job_once_with_its_own_words(pair: tuple[Conn, Conn]) -> None:
    """Every created job is logged exactly once, with its own words (no cutting: the log has no limit)."""
    conn, listener = pair
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    kinds = ["email.send", "k" * 40, 'a"quote\\and\u00e9', "x" * 1000]
    specs: list[dict[str, Any]] = []
    for i in range(1500):
        spec: dict[str, Any] = {"kind": kinds[i % 7 % len(kinds)] if i % 50 else kinds[3], "queue": f"q{i % 3}"}
        if i % 11 == 0:
            spec["run_at"] = later
        specs.append(spec)
    rows = call(conn, "enqueue_many", jobs=specs)
    notes = drain(listener)
    events = status_events(conn)
    assert [e["id"] for e in events] == [r["id"] for r in rows]
    for row, spec, e in zip(rows, specs, events, strict=True):
        assert e["id"] == row["id"] and set(e) == KEYS
        assert e["queue"] == spec["queue"] and e["attempt"] == 0 and e["batch_id"] is None
        assert e["state"] == ("scheduled" if "run_at" in spec else "pending")
        assert e["kind"] == spec["kind"]
    assert sorted(payloads(notes, "pgjobs_wake")) == ["q0", "q1", "q2"]

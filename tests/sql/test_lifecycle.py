"""Doing work: the lease-token compare-and-set calls (renew_lease, checkpoint, progress, complete,
complete_many, fail, dead_letter, release), backoff, and the stale-token no-op."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from tests.helpers.foundation import claim, claim_one, enqueue, expire, job, scalar, snapshot

Conn = psycopg.Connection[Any]


def now(conn: Conn) -> datetime:
    return conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index,no-any-return]


def started(conn: Conn, **kwargs: Any) -> dict[str, Any]:
    """One job, enqueued and claimed."""
    enqueue(conn, "k", **kwargs)
    return claim_one(conn)


def make_due(conn: Conn, id: int) -> None:
    conn.execute("UPDATE pgjobs.jobs SET run_at = now() - interval '1 second' WHERE id = %s", [id])


@pytest.mark.smoke
def test_complete(conn: Conn) -> None:
    c = started(conn)
    assert scalar(conn, "complete", id=c["id"], lease_token=c["lease_token"], result={"ok": 1}) is True
    row = job(conn, c["id"])
    assert row["state"] == "succeeded" and row["result"] == {"ok": 1}
    assert row["completed_at"] is not None and row["lease_token"] is None and row["lease_expires_at"] is None
    assert row["attempt"] == 1
    # a second completion with the same token is a benign no-op
    assert scalar(conn, "complete", id=c["id"], lease_token=c["lease_token"]) is False


def test_complete_many(conn: Conn) -> None:
    for _ in range(4):
        enqueue(conn)
    got = claim(conn, max_jobs=4)
    ids = [g["id"] for g in got]
    tokens = [g["lease_token"] for g in got]
    tokens[3] = uuid.uuid4()  # one stale pair is skipped
    assert scalar(conn, "complete_many", ids=ids, lease_tokens=tokens) == 3
    states = [job(conn, i)["state"] for i in ids]
    assert states == ["succeeded", "succeeded", "succeeded", "active"]
    # again: all already done or stale
    assert scalar(conn, "complete_many", ids=ids, lease_tokens=tokens) == 0
    assert scalar(conn, "complete_many", ids=[], lease_tokens=[]) == 0


def test_complete_many_with_results(conn: Conn) -> None:
    enqueue(conn)
    enqueue(conn)
    got = claim(conn, max_jobs=2)
    n = conn.execute(
        "SELECT pgjobs.complete_many(ids => %s, lease_tokens => %s, results => ARRAY['{\"r\": 1}', NULL]::jsonb[])",
        [[g["id"] for g in got], [g["lease_token"] for g in got]],
    ).fetchone()
    assert n == (2,)
    assert [job(conn, g["id"])["result"] for g in got] == [{"r": 1}, None]


def test_renew_lease_extends_the_lease(conn: Conn) -> None:
    c = started(conn, max_attempts=3)
    assert scalar(conn, "renew_lease", id=c["id"], lease_token=c["lease_token"], lease=timedelta(hours=1)) is True
    assert job(conn, c["id"])["lease_expires_at"] > now(conn) + timedelta(minutes=59)
    # a renewed lease is not reclaimed
    assert claim(conn) == []


def test_checkpoint_is_kept_for_the_next_attempt(conn: Conn) -> None:
    c = started(conn)
    assert scalar(conn, "checkpoint", id=c["id"], lease_token=c["lease_token"], checkpoint={"cursor": 42}) is True
    assert job(conn, c["id"])["checkpoint"] == {"cursor": 42}
    assert scalar(conn, "fail", id=c["id"], lease_token=c["lease_token"], error="x", retry_at=now(conn)) == "pending"
    again = claim_one(conn)
    assert again["attempt"] == 2 and again["checkpoint"] == {"cursor": 42}


def test_progress_is_stored(conn: Conn) -> None:
    c = started(conn)
    assert scalar(conn, "progress", id=c["id"], lease_token=c["lease_token"], progress={"done": 5, "of": 10}) is True
    assert job(conn, c["id"])["progress"] == {"done": 5, "of": 10}


@pytest.mark.smoke
def test_fail_with_attempts_left_schedules_a_retry_with_backoff(conn: Conn) -> None:
    c = started(conn, max_attempts=3)
    state = scalar(conn, "fail", id=c["id"], lease_token=c["lease_token"], error="timeout talking to smtp")
    assert state == "scheduled"
    row = job(conn, c["id"])
    assert row["state"] == "scheduled" and row["run_at"] > now(conn)
    assert row["last_error"] == "timeout talking to smtp"
    assert row["errors"][-1]["error"] == "timeout talking to smtp" and row["errors"][-1]["attempt"] == 1
    assert row["lease_token"] is None and row["completed_at"] is None
    assert claim(conn) == []  # not due yet


def test_fail_with_retry_at_now_or_past_is_pending_and_later_is_scheduled(conn: Conn) -> None:
    c = started(conn)
    assert scalar(conn, "fail", id=c["id"], lease_token=c["lease_token"], error="e", retry_at=now(conn)) == "pending"
    c = claim_one(conn)
    past = datetime(2020, 1, 1, tzinfo=UTC)
    assert scalar(conn, "fail", id=c["id"], lease_token=c["lease_token"], error="e", retry_at=past) == "pending"
    assert job(conn, c["id"])["run_at"] >= past
    c = claim_one(conn)
    later = now(conn) + timedelta(minutes=10)
    assert scalar(conn, "fail", id=c["id"], lease_token=c["lease_token"], error="e", retry_at=later) == "scheduled"
    assert job(conn, c["id"])["run_at"] == later


def test_backoff_grows_and_ends_in_failed(conn: Conn) -> None:
    jid = enqueue(conn, max_attempts=5)["id"]
    delays: list[float] = []
    for attempt in range(1, 6):
        make_due(conn, jid)
        c = claim_one(conn)
        assert c["attempt"] == attempt
        state = scalar(conn, "fail", id=jid, lease_token=c["lease_token"], error=f"e{attempt}")
        row = job(conn, jid)
        if attempt < 5:
            assert state == "scheduled"
            failed_at = datetime.fromisoformat(row["errors"][-1]["at"])  # the fail's own now()
            delays.append((row["run_at"] - failed_at).total_seconds())
        else:
            assert state == "failed"
            assert row["completed_at"] is not None
    assert all(later > earlier for earlier, later in itertools.pairwise(delays)), delays
    assert delays[0] > 0
    row = job(conn, jid)
    assert [e["attempt"] for e in row["errors"]] == [1, 2, 3, 4, 5]
    assert claim(conn) == []


def test_backoff_is_capped_and_jittered(conn: Conn) -> None:
    capped = [
        r[0] for r in conn.execute("SELECT pgjobs.retry_backoff(attempt) FROM generate_series(25, 30) AS attempt")
    ]
    assert all(timedelta(0) < d <= timedelta(hours=1) for d in capped)
    samples = {r[0] for r in conn.execute("SELECT pgjobs.retry_backoff(3) FROM generate_series(1, 20)")}
    assert len(samples) > 1  # jitter


def test_dead_letter_fails_now_whatever_attempts_are_left(conn: Conn) -> None:
    c = started(conn, max_attempts=10)
    assert scalar(conn, "dead_letter", id=c["id"], lease_token=c["lease_token"], error="poison") is True
    row = job(conn, c["id"])
    assert row["state"] == "failed" and row["last_error"] == "poison" and row["completed_at"] is not None
    assert scalar(conn, "dead_letter", id=c["id"], lease_token=c["lease_token"], error="poison") is False


def test_release_refunds_the_attempt(conn: Conn) -> None:
    c = started(conn, max_attempts=1)
    assert scalar(conn, "release", id=c["id"], lease_token=c["lease_token"]) is True
    row = job(conn, c["id"])
    assert row["state"] == "pending" and row["attempt"] == 0 and row["lease_token"] is None
    again = claim_one(conn)
    assert again["attempt"] == 1  # the only allowed attempt is still there
    assert scalar(conn, "fail", id=c["id"], lease_token=again["lease_token"], error="e") == "failed"


def test_release_at_a_later_time_schedules_it(conn: Conn) -> None:
    c = started(conn)
    later = now(conn) + timedelta(minutes=5)
    assert scalar(conn, "release", id=c["id"], lease_token=c["lease_token"], run_at=later) is True
    row = job(conn, c["id"])
    assert (row["state"], row["run_at"], row["attempt"]) == ("scheduled", later, 0)
    assert claim(conn) == []


def test_release_of_a_reclaimed_job_gives_back_only_the_current_attempt(conn: Conn) -> None:
    c = started(conn)
    expire(conn, c["id"])
    c2 = claim_one(conn)
    assert c2["attempt"] == 2
    assert scalar(conn, "release", id=c["id"], lease_token=c2["lease_token"]) is True
    assert job(conn, c["id"])["attempt"] == 1


def test_fail_of_a_cancel_requested_job_ends_it_cancelled(conn: Conn) -> None:
    c = started(conn)
    assert scalar(conn, "cancel", id=c["id"]) is True
    assert scalar(conn, "fail", id=c["id"], lease_token=c["lease_token"], error="stopped") == "cancelled"
    assert job(conn, c["id"])["state"] == "cancelled"


StaleCall = Callable[[Conn, int, uuid.UUID], Any]
STALE_CALLS: dict[str, tuple[StaleCall, Any]] = {
    "renew_lease": (lambda c, i, t: scalar(c, "renew_lease", id=i, lease_token=t, lease=timedelta(minutes=1)), False),
    "checkpoint": (lambda c, i, t: scalar(c, "checkpoint", id=i, lease_token=t, checkpoint={"x": 1}), False),
    "progress": (lambda c, i, t: scalar(c, "progress", id=i, lease_token=t, progress={"x": 1}), False),
    "complete": (lambda c, i, t: scalar(c, "complete", id=i, lease_token=t, result={"x": 1}), False),
    "complete_many": (lambda c, i, t: scalar(c, "complete_many", ids=[i], lease_tokens=[t]), 0),
    "fail": (lambda c, i, t: scalar(c, "fail", id=i, lease_token=t, error="x"), None),
    "fail_retry_at": (
        lambda c, i, t: scalar(c, "fail", id=i, lease_token=t, error="x", retry_at=datetime.now(UTC)),
        None,
    ),
    "dead_letter": (lambda c, i, t: scalar(c, "dead_letter", id=i, lease_token=t, error="x"), False),
    "release": (lambda c, i, t: scalar(c, "release", id=i, lease_token=t), False),
}


@pytest.mark.smoke
def test_a_stale_token_changes_nothing_and_returns_false_or_null(conn: Conn) -> None:
    for (name, (fn, expected)), scenario in itertools.product(
        STALE_CALLS.items(), ("random_token", "reclaimed", "finished", "unknown_id")
    ):
        c = started(conn, max_attempts=5)
        jid, token = c["id"], c["lease_token"]
        if scenario == "random_token":
            token = uuid.uuid4()
        elif scenario == "reclaimed":
            expire(conn, jid)
            claim_one(conn, "w2")  # a new attempt holds it now; `token` is the old one
        elif scenario == "finished":
            assert scalar(conn, "complete", id=jid, lease_token=token) is True
        else:
            jid = jid + 1000
        before = snapshot(conn)
        assert fn(conn, jid, token) == expected, (name, scenario)
        assert snapshot(conn) == before, (name, scenario)
        conn.execute("UPDATE pgjobs.jobs SET state = 'cancelled', lease_token = NULL WHERE state = 'active'")

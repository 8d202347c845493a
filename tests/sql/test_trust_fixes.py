"""Reproducers of trust defects: the cancellation rule, stale batches, unbounded times and names, one bad schedule.

Each test is the hand-checked reproducer of the issue (or the rule decided for it) against a fresh database.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from tests.helpers.foundation import (
    call,
    claim_one,
    drain,
    enqueue,
    job,
    listen,
    raises_pj,
    scalar,
    snapshot,
)
from tests.helpers.invariants import violations

Conn = psycopg.Connection[Any]
NOW = datetime.now(UTC)


def running(conn: Conn, kind: str = "k", **kwargs: Any) -> tuple[int, Any]:
    jid = int(enqueue(conn, kind, **kwargs)["id"])
    c = claim_one(conn, queues=[kwargs.get("queue", "default")])
    assert c["id"] == jid
    return jid, c["lease_token"]


# ------------------------------------------------------------------------- item 3: the cancellation rule
ENDINGS = {
    "complete": lambda conn, jid, tok: scalar(conn, "complete", id=jid, lease_token=tok, result={"r": 1}),
    "complete_many": lambda conn, jid, tok: scalar(conn, "complete_many", ids=[jid], lease_tokens=[tok]),
    "fail": lambda conn, jid, tok: scalar(conn, "fail", id=jid, lease_token=tok, error="e"),
    "dead_letter": lambda conn, jid, tok: scalar(conn, "dead_letter", id=jid, lease_token=tok, error="e"),
    "release": lambda conn, jid, tok: scalar(conn, "release", id=jid, lease_token=tok),
    "ack_cancel": lambda conn, jid, tok: scalar(conn, "ack_cancel", id=jid, lease_token=tok),
}


@pytest.mark.smoke
@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_a_requested_cancellation_ends_the_attempt_cancelled_whichever_call_ends_it(conn: Conn, ending: str) -> None:
    jid, tok = running(conn)
    child = call(conn, "enqueue_many", jobs=[{"kind": "c", "depends_on": [{"job": jid, "on": "success"}]}])[0]["id"]
    assert scalar(conn, "cancel", id=jid) is True
    assert job(conn, jid)["state"] == "active"  # only requested
    result = ENDINGS[ending](conn, jid, tok)
    assert result in (True, 1, "cancelled")  # the token held the job: the attempt ended
    row = job(conn, jid)
    assert row["state"] == "cancelled" and row["lease_token"] is None and row["completed_at"] is not None
    assert job(conn, child)["state"] == "cancelled"  # a success continuation of a cancelled parent
    assert violations(conn) == {}


@pytest.mark.parametrize("ending", ["complete", "complete_many", "fail", "dead_letter", "release"])
def test_without_a_request_the_endings_do_what_they_say(conn: Conn, ending: str) -> None:
    jid, tok = running(conn, max_attempts=5)
    ENDINGS[ending](conn, jid, tok)
    expected = {"complete": "succeeded", "complete_many": "succeeded", "fail": "scheduled", "dead_letter": "failed"}
    assert job(conn, jid)["state"] in ({expected[ending]} if ending != "release" else {"pending"})


def test_ack_cancel_without_a_request_changes_nothing(conn: Conn) -> None:
    jid, tok = running(conn)
    before = snapshot(conn)
    assert scalar(conn, "ack_cancel", id=jid, lease_token=tok) is False
    assert snapshot(conn) == before
    assert scalar(conn, "complete", id=jid, lease_token=tok) is True  # the worker still holds it
    assert job(conn, jid)["state"] == "succeeded"


def test_a_forged_cancel_notification_changes_nothing_in_the_database(conn: Conn, connect: Any) -> None:
    """Any role can NOTIFY pgjobs_cancel; the database state is the only fact: renew_leases reports no
    cancellation, and an ack_cancel a fooled worker sends is refused."""
    jid, tok = running(conn)
    listener = connect()
    listen(listener, "pgjobs_cancel")
    before = snapshot(conn)
    forger = connect()
    forger.execute("SELECT pg_notify('pgjobs_cancel', %s)", [str(jid)])
    assert ("pgjobs_cancel", str(jid)) in drain(listener)  # the hint arrives ...
    assert snapshot(conn) == before  # ... and is no fact
    renewed = call(conn, "renew_leases", ids=[jid], lease_tokens=[tok], lease=30)
    assert renewed == [{"id": jid, "cancel_requested": False, "renewed": True}]
    assert scalar(conn, "ack_cancel", id=jid, lease_token=tok) is False
    assert job(conn, jid)["state"] == "active"
    # a real cancellation is what renew_leases reports
    assert scalar(conn, "cancel", id=jid) is True
    assert call(conn, "renew_leases", ids=[jid], lease_tokens=[tok], lease=30) == [
        {"id": jid, "cancel_requested": True, "renewed": True}
    ]


def test_a_cancelled_completion_adds_no_continuations(conn: Conn) -> None:
    jid, tok = running(conn)
    scalar(conn, "cancel", id=jid)
    assert scalar(conn, "complete", id=jid, lease_token=tok, continuations=[{"kind": "next"}]) is True
    assert conn.execute("SELECT count(*) FROM pgjobs.jobs WHERE kind = 'next'").fetchone() == (0,)


# --------------------------------------------------------------------------------- item 4: stale state
def test_deleting_a_batch_member_resettles_the_batch(conn: Conn) -> None:
    ids = [r["id"] for r in call(conn, "enqueue_many", jobs=[{"kind": "a"}, {"kind": "b"}], as_batch=True)]
    batch = call(conn, "job_status", id=ids[0])[0]["batch_id"]
    c = claim_one(conn)
    scalar(conn, "dead_letter", id=c["id"], lease_token=c["lease_token"], error="x")
    c = claim_one(conn)
    scalar(conn, "complete", id=c["id"], lease_token=c["lease_token"])
    status = call(conn, "batch_status", batch_id=batch)[0]
    assert status["state"] == "failed" and status["failed"] == 1
    failed = ids[0] if job(conn, ids[0])["state"] == "failed" else ids[1]
    assert scalar(conn, "delete", id=failed) is True
    status = call(conn, "batch_status", batch_id=batch)[0]
    assert (status["state"], status["total"], status["failed"], status["succeeded"]) == ("succeeded", 1, 0, 1)
    assert violations(conn) == {}


@pytest.mark.parametrize("when", ["infinity", "-infinity", "294276-01-01T00:00:00Z", "10000-01-01T00:00:00Z"])
def test_an_infinite_or_absurd_run_at_is_refused(conn: Conn, when: str) -> None:
    before = snapshot(conn)
    with raises_pj("PJ002", "run_at", when[:5]):
        conn.execute("SELECT * FROM pgjobs.enqueue(kind => 'k', run_at => %s::timestamptz)", [when])
    with raises_pj("PJ002", "run_at"):
        call(conn, "enqueue_many", jobs=[{"kind": "k", "run_at": when}])
    with raises_pj("PJ002", "run_at"):
        call(conn, "enqueue_many", jobs=[{"kind": "k", "run_at": when, "unique_key": "u"}])
    jid, tok = running(conn)
    with raises_pj("PJ002", "retry_at"):
        conn.execute("SELECT pgjobs.fail(id => %s, lease_token => %s, error => 'e', retry_at => %s)", [jid, tok, when])
    with raises_pj("PJ002", "run_at"):
        conn.execute("SELECT pgjobs.release(id => %s, lease_token => %s, run_at => %s)", [jid, tok, when])
    assert snapshot(conn)["jobs"] == [tuple(r) for r in conn.execute("SELECT * FROM pgjobs.jobs ORDER BY id")]
    assert before["jobs"] == []
    # the far future most programs write still works
    assert enqueue(conn, "k", run_at="9999-12-31T00:00:00Z")["state"] == "scheduled"


# ---------------------------------------------------------------------------------------- item 5: limits
LONG = "x" * 8001
ZERO = "00000000-0000-0000-0000-000000000000"


@pytest.mark.parametrize(
    ("function", "kwargs", "named"),
    [
        ("enqueue", {"kind": LONG}, "kind"),
        ("enqueue", {"kind": "k", "queue": LONG}, "queue"),
        ("enqueue", {"kind": "k", "unique_key": "u" * 1001}, "unique_key"),
        ("enqueue", {"kind": "k", "group_key": "g" * 1001}, "group_key"),
        ("enqueue_many", {"jobs": [{"kind": LONG}]}, "kind"),
        ("enqueue_many", {"jobs": [{"kind": "k", "queue": LONG}]}, "queue"),
        ("enqueue_many", {"jobs": [{"kind": "k", "unique_key": "u" * 2700}]}, "unique_key"),
        ("enqueue_many", {"jobs": [{"kind": "k", "group_key": "g" * 2700}]}, "group_key"),
        ("enqueue_many", {"jobs": [{"kind": "k", "group_key": "g" * 2700}], "as_batch": True}, "group_key"),
        ("claim", {"worker": LONG}, "worker"),
        ("claim", {"worker": "w", "max_jobs": 2**30}, "max_jobs"),
        ("claim", {"worker": "w", "max_jobs": 10_001}, "max_jobs"),
        ("claim", {"worker": "w", "lease": "100000000 years"}, "lease"),
        ("claim", {"worker": "w", "queues": [["a", "b"], ["c", "d"]]}, "queues"),
        ("renew_lease", {"id": 1, "lease_token": ZERO, "lease": "1e8 years"}, "lease"),
        ("renew_leases", {"ids": [1], "lease_tokens": [ZERO], "lease": "1e8 years"}, "lease"),
        ("purge", {"succeeded_before": "100000000 years"}, "succeeded_before"),
        ("purge", {"failed_before": "100000000 years"}, "failed_before"),
        ("reap_workers", {"stale_after": "100000000 years"}, "stale_after"),
        ("worker_heartbeat", {"worker": LONG}, "worker"),
        ("configure_queue", {"queue": LONG, "paused": True}, "queue"),
        ("prune_code_schedules", {"keep": [["a", "b"], ["c", "d"]]}, "keep"),
        ("upsert_schedule", {"name": "n" * 2700, "kind": "k", "cron": "* * * * *", "next_run_at": NOW}, "name"),
        (
            "upsert_schedule",
            {"name": "s", "kind": "k", "cron": "* * * * *", "next_run_at": NOW, "queue": LONG},
            "queue",
        ),
        ("upsert_schedule", {"name": "s", "kind": LONG, "cron": "* * * * *", "next_run_at": NOW}, "kind"),
        ("pause_schedule", {"name": LONG}, "name"),
        ("list_jobs", {"max_rows": 2**31 - 1}, "max_rows"),
    ],
)
def test_values_beyond_the_documented_limits_are_refused_with_pj002(
    conn: Conn, function: str, kwargs: dict[str, Any], named: str
) -> None:
    interval_args = {k for k, v in kwargs.items() if isinstance(v, str) and "years" in v}
    args = {k: v for k, v in kwargs.items() if k not in interval_args}
    casts = {"queues": "::text[]", "keep": "::text[]", "ids": "::bigint[]", "lease_tokens": "::uuid[]"}
    if interval_args:
        # intervals the Python side cannot hold go as text
        sets = ", ".join(
            [f"{k} => %({k})s{casts.get(k, '')}" for k in args] + [f"{k} => %({k})s::interval" for k in interval_args]
        )
        params = dict(args, **{k: kwargs[k].replace("1e8", "100000000") for k in interval_args})
        for k in ("ids", "lease_tokens"):
            if k in params:
                params[k] = [str(x) for x in params[k]]
        with raises_pj("PJ002", named):
            conn.execute(f"SELECT * FROM pgjobs.{function}({sets})", params)  # type: ignore[arg-type]
        return
    before = snapshot(conn)
    with raises_pj("PJ002", named) as info:
        call(conn, function, **kwargs)
    assert len(info.value.diag.message_primary or "") < 600  # the value is echoed cut
    assert snapshot(conn) == before


def test_names_at_the_limits_are_accepted(conn: Conn) -> None:
    row = enqueue(conn, "k" * 1000, queue="q" * 1000, unique_key="u" * 1000, group_key="g" * 1000)
    assert row["created"] is True
    assert call(conn, "enqueue_many", jobs=[{"kind": "é" * 500, "queue": "q" * 1000, "group_key": "g" * 1000}])
    got = call(conn, "claim", worker="w" * 1000, queues=["q" * 1000], max_jobs=10_000, lease=timedelta(days=36000))
    assert len(got) == 2
    with raises_pj("PJ002", "kind"):
        enqueue(conn, "é" * 501)  # bytes, not characters


# ------------------------------------------------------------------------------ item 2: one bad schedule
def test_a_schedule_whose_run_cannot_be_inserted_is_refused_at_upsert(conn: Conn) -> None:
    with raises_pj("PJ002", "queue"):
        call(conn, "upsert_schedule", name="bad", kind="k", cron="* * * * *", next_run_at=NOW, queue="q" * 8000)
    with raises_pj("PJ002", "schedule name"):
        call(conn, "upsert_schedule", name="n" * 2700, kind="k", cron="* * * * *", next_run_at=NOW)
    assert conn.execute("SELECT count(*) FROM pgjobs.schedules").fetchone() == (0,)


def test_one_failing_schedule_is_skipped_and_reported_and_the_others_run(conn: Conn) -> None:
    """A schedule stored before these checks (or broken by hand) whose run cannot be inserted."""
    due = NOW - timedelta(minutes=1)
    for name in ("bad", "good"):
        call(conn, "upsert_schedule", name=name, kind="k", cron="* * * * *", next_run_at=due)
    # planted as an older version could have stored it: an 8,000-byte queue name
    conn.execute("UPDATE pgjobs.schedules SET queue = repeat('q', 8000) WHERE name = 'bad'")
    nxt = due + timedelta(minutes=1)
    rows = call(
        conn, "materialize_schedules", names=["bad", "good"], expected_run_ats=[due, due], next_run_ats=[nxt, nxt]
    )
    by_name = {r["name"]: r for r in rows}
    assert by_name["good"]["job_id"] is not None and by_name["good"]["created"] is True
    assert by_name["good"]["error"] is None
    assert by_name["bad"]["job_id"] is None and by_name["bad"]["error"]  # (SQLSTATE: message)
    assert conn.execute("SELECT count(*) FROM pgjobs.jobs").fetchone() == (1,)
    # the bad one moved on (skipped, like the 'skip' policy) and kept its last run and job
    bad = conn.execute("SELECT next_run_at, last_run_at, last_job_id FROM pgjobs.schedules WHERE name = 'bad'")
    assert bad.fetchone() == (nxt, None, None)
    assert violations(conn) == {}


def test_a_full_queue_still_fails_the_batch_so_the_run_stays_due(conn: Conn) -> None:
    due = NOW - timedelta(minutes=1)
    call(conn, "configure_queue", queue="small", max_length=1)
    enqueue(conn, "filler", queue="small")
    call(conn, "upsert_schedule", name="s", kind="k", cron="* * * * *", next_run_at=due, queue="small")
    with raises_pj("PJ001"):
        call(conn, "materialize_schedules", names=["s"], expected_run_ats=[due], next_run_ats=[due + timedelta(1)])


# ------------------------------------------------------------------ item 1: an existing unique key in a call
def test_an_existing_unique_key_in_enqueue_many_keeps_the_other_specs_dependencies(conn: Conn) -> None:
    enqueue(conn, "a", unique_key="taken")
    live = enqueue(conn, "k", run_at=NOW + timedelta(days=1))["id"]
    rows = call(
        conn,
        "enqueue_many",
        jobs=[{"kind": "c", "depends_on": [{"job": live, "on": "complete"}]}, {"kind": "a", "unique_key": "taken"}],
    )
    child = job(conn, rows[0]["id"])
    assert (child["state"], child["remaining_deps"]) == ("waiting", 1)  # not claimable before its parent ran
    assert rows[1]["created"] is False
    assert violations(conn) == {}


def test_an_existing_unique_key_in_enqueue_many_settles_edges_on_finished_parents(conn: Conn) -> None:
    enqueue(conn, "a", unique_key="taken")
    jid, tok = running(conn, "p", queue="p")
    scalar(conn, "dead_letter", id=jid, lease_token=tok, error="x")
    rows = call(
        conn,
        "enqueue_many",
        jobs=[
            {"kind": "s", "depends_on": [{"job": jid, "on": "success"}]},  # can never be met: cancelled
            {"kind": "f", "depends_on": [{"job": jid, "on": "failure"}]},  # met: runs
            {"kind": "a", "unique_key": "taken"},
        ],
    )
    assert [job(conn, r["id"])["state"] for r in rows[:2]] == ["cancelled", "pending"]
    assert violations(conn) == {}


def test_a_child_cancelled_by_its_dependency_is_retried_through_its_parent(conn: Conn) -> None:
    """Found by the lifecycle model: retry of a child whose edge settled unmet ran it with that edge unmet."""
    rows = call(
        conn,
        "enqueue_many",
        jobs=[{"kind": "p", "ref": "p"}, {"kind": "c", "depends_on": [{"ref": "p", "on": "failure"}]}],
    )
    parent, child = rows[0]["id"], rows[1]["id"]
    assert scalar(conn, "cancel", id=parent) is True
    assert job(conn, child)["state"] == "cancelled"
    before = snapshot(conn)
    with raises_pj("PJ004", f"job {child} cannot be retried", f"job {parent}"):
        scalar(conn, "retry", id=child)
    assert snapshot(conn) == before
    assert scalar(conn, "retry", id=parent) is True  # reopens the child: it waits for its parent again
    assert job(conn, child)["state"] == "waiting"
    assert violations(conn) == {}


def test_a_child_cancelled_while_it_waited_waits_again_when_retried(conn: Conn) -> None:
    """Found by the lifecycle model: such a retry made the child pending with its parent still live."""
    rows = call(
        conn,
        "enqueue_many",
        jobs=[{"kind": "p", "ref": "p"}, {"kind": "c", "depends_on": [{"ref": "p", "on": "success"}]}],
    )
    parent, child = rows[0]["id"], rows[1]["id"]
    assert scalar(conn, "cancel", id=child) is True
    assert scalar(conn, "retry", id=child) is True
    row = job(conn, child)
    assert (row["state"], row["remaining_deps"]) == ("waiting", 1)
    assert violations(conn) == {}
    c = claim_one(conn)
    assert c["id"] == parent  # the child is not claimable before its parent ran
    scalar(conn, "complete", id=parent, lease_token=c["lease_token"])
    assert job(conn, child)["state"] == "pending"

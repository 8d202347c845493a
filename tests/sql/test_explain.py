"""explain(id) names the blocker: one test per reason, each checked against what the claim then does (a job
called claimable is the one a claim takes; a blocked one is not taken), on a real database."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import psycopg

from tests.helpers.foundation import call, claim, claim_one, enqueue, expire, scalar

Conn = psycopg.Connection[Any]
TRACEBACK = 'Traceback (most recent call last):\n  File "app.py", line 3, in run\n    int(x)\nValueError: boom\n'


def explain(conn: Conn, id: int) -> Any:
    return scalar(conn, "explain", id=id)


def heartbeat(conn: Conn, worker: str = "w", **meta: Any) -> None:
    """A worker's heartbeat with the meta the Python worker sends (runtime/leases.py, worker_meta)."""
    meta.setdefault("queues", {"default": 4})
    meta.setdefault("heartbeat_interval", 10)
    call(conn, "worker_heartbeat", worker=worker, meta=meta)


def test_unknown_id_is_null(conn: Conn) -> None:
    assert explain(conn, 424242) is None


def test_terminal_names_state_time_and_the_error_line(conn: Conn) -> None:
    jid = enqueue(conn, "k", max_attempts=1)["id"]
    got = claim_one(conn)
    call(conn, "fail", id=jid, lease_token=got["lease_token"], error=TRACEBACK)
    why = explain(conn, jid)
    row = conn.execute("SELECT completed_at FROM pgjobs.jobs WHERE id = %s", [jid]).fetchone()
    assert row is not None
    assert why["reason"] == "terminal" and why["state"] == "failed" and why["attempt"] == 1
    assert datetime.fromisoformat(why["completed_at"]) == row[0]
    assert why["last_error"] == "ValueError: boom"


def test_running_names_worker_and_lease_end_never_the_token(conn: Conn) -> None:
    jid = enqueue(conn)["id"]
    got = claim_one(conn, "w-7")
    why = explain(conn, jid)
    assert why["reason"] == "running" and why["worker"] == "w-7" and why["attempt"] == 1
    assert datetime.fromisoformat(why["lease_expires_at"]) == got["lease_expires_at"]
    assert why["worker_live"] is None  # w-7 never sent a heartbeat
    assert str(got["lease_token"]) not in json.dumps(why) and "token" not in json.dumps(why)
    heartbeat(conn, "w-7")
    assert explain(conn, jid)["worker_live"] is True


def test_a_lapsed_lease_is_claimable_again_and_says_whose_it_was(conn: Conn) -> None:
    heartbeat(conn)
    jid = enqueue(conn)["id"]
    claim_one(conn, "gone")
    expire(conn, jid)
    why = explain(conn, jid)
    assert why["reason"] == "claimable" and why["last_worker"] == "gone" and "lease_lapsed_at" in why
    assert "settles_as" not in why
    assert claim_one(conn, "w")["id"] == jid


def test_a_lapsed_lease_on_the_last_attempt_is_ended_by_the_next_claim(conn: Conn) -> None:
    heartbeat(conn)
    jid = enqueue(conn, max_attempts=1)["id"]
    claim_one(conn, "gone")
    expire(conn, jid)
    assert explain(conn, jid)["settles_as"] == "failed"
    assert claim(conn) == []
    assert explain(conn, jid)["state"] == "failed"


def test_waiting_names_each_open_parent_job_and_batch(conn: Conn) -> None:
    heartbeat(conn)
    (batch_member,) = call(conn, "enqueue_many", jobs=[{"kind": "m"}, {"kind": "m"}], as_batch=True)[:1]
    batch_id = batch_member["batch_id"]
    specs = [
        {"ref": "p", "kind": "parent"},
        {"ref": "c", "kind": "child", "depends_on": [{"ref": "p", "on": "complete"}, {"batch": batch_id}]},
    ]
    ids = {r["ref"]: r["id"] for r in call(conn, "enqueue_many", jobs=specs)}
    why = explain(conn, ids["c"])
    assert why["reason"] == "waiting_dependencies" and why["remaining"] == 2
    assert why["waiting_on"] == [
        {"job": ids["p"], "on": "complete", "state": "pending"},
        {"batch": batch_id, "on": "success", "state": "executing", "pending": 2, "total": 2},
    ]


def test_waiting_lists_a_hundred_parents_and_counts_the_rest(conn: Conn) -> None:
    heartbeat(conn)
    specs: list[dict[str, Any]] = [{"ref": f"p{i}", "kind": "p"} for i in range(105)]
    specs.append({"ref": "c", "kind": "c", "depends_on": [{"ref": f"p{i}"} for i in range(105)]})
    ids = {r["ref"]: r["id"] for r in call(conn, "enqueue_many", jobs=specs)}
    why = explain(conn, ids["c"])
    assert why["remaining"] == 105 and len(why["waiting_on"]) == 100 and why["more"] == 5
    assert [p["job"] for p in why["waiting_on"]] == [ids[f"p{i}"] for i in range(100)]


def test_scheduled_names_the_time_and_a_retry_its_error(conn: Conn) -> None:
    heartbeat(conn)
    later = enqueue(conn, run_at="2999-01-01T00:00:00Z")["id"]
    why = explain(conn, later)
    assert why["reason"] == "scheduled" and why["retry"] is False and why["run_at"].startswith("2999-01-01T00:00:00")
    jid = enqueue(conn)["id"]
    got = claim_one(conn)
    assert got["id"] == jid
    call(conn, "fail", id=jid, lease_token=got["lease_token"], error=TRACEBACK, retry_at="2999-01-01T00:00:00Z")
    why = explain(conn, jid)
    assert why["reason"] == "scheduled" and why["retry"] is True and why["attempt"] == 1
    assert why["last_error"] == "ValueError: boom"


def test_paused_queue_blocks_and_shows_under_also_of_a_scheduled_job(conn: Conn) -> None:
    heartbeat(conn)
    jid = enqueue(conn)["id"]
    later = enqueue(conn, run_at="2999-01-01T00:00:00Z")["id"]
    call(conn, "configure_queue", queue="default", paused=True)
    assert explain(conn, jid) == {"reason": "paused", "queue": "default"}
    assert explain(conn, later)["also"] == ["paused"]
    assert claim(conn) == []
    call(conn, "configure_queue", queue="default", paused=False)
    assert explain(conn, jid)["reason"] == "claimable"


def test_queue_cap_says_n_of_m_active(conn: Conn) -> None:
    """Race-free: the active jobs are made by this test's own claims, so the count is known exactly."""
    heartbeat(conn)
    call(conn, "configure_queue", queue="default", max_active=3)
    ids = [enqueue(conn)["id"] for _ in range(5)]
    got = claim(conn, max_jobs=5)
    assert [g["id"] for g in got] == ids[:3]
    why = explain(conn, ids[3])
    assert why == {"reason": "queue_cap", "queue": "default", "active": 3, "max_active": 3}
    assert claim(conn) == []
    call(conn, "complete", id=got[0]["id"], lease_token=got[0]["lease_token"])
    assert explain(conn, ids[3])["reason"] == "claimable"
    assert explain(conn, ids[4]) == {
        "reason": "behind_others", "queue": "default", "ahead": 1, "at_least": False, "fair": False,
    }  # fmt: skip
    call(conn, "configure_queue", queue="default", max_active=5)
    assert explain(conn, ids[3])["reason"] == "claimable"


def test_a_lapsed_lease_does_not_count_against_the_cap(conn: Conn) -> None:
    """The claim makes a lapsed job pending before it counts the active ones: the job is not its own blocker."""
    heartbeat(conn)
    call(conn, "configure_queue", queue="default", max_active=1)
    first, second = enqueue(conn)["id"], enqueue(conn)["id"]
    assert claim_one(conn, "gone")["id"] == first
    assert explain(conn, second)["reason"] == "queue_cap"
    expire(conn, first)
    why = explain(conn, first)
    assert why["reason"] == "claimable" and why["last_worker"] == "gone"
    assert explain(conn, second)["ahead"] == 1
    assert claim_one(conn, "w")["id"] == first
    assert explain(conn, second) == {"reason": "queue_cap", "queue": "default", "active": 1, "max_active": 1}


def test_group_cap_names_the_group_and_the_claim_passes_over_it(conn: Conn) -> None:
    heartbeat(conn, queues={"q": 4})
    call(conn, "configure_queue", queue="q", max_active_per_group=1)
    a1, a2 = (enqueue(conn, queue="q", group_key="a")["id"] for _ in range(2))
    b1 = enqueue(conn, queue="q", group_key="b")["id"]
    assert claim_one(conn, queues=["q"])["id"] == a1
    why = explain(conn, a2)
    assert why == {"reason": "group_cap", "queue": "q", "group_key": "a", "active": 1, "max_active_per_group": 1}
    # a2 sorts before b1 but its group is at its cap: nothing claimable is ahead of b1, and a claim takes it
    assert explain(conn, b1) == {"reason": "claimable", "queue": "q"}
    assert claim_one(conn, queues=["q"])["id"] == b1


def test_no_worker_for_the_queue_or_the_kind(conn: Conn) -> None:
    jid = enqueue(conn, "mail.send", queue="mail")["id"]
    why = explain(conn, jid)
    assert why["reason"] == "no_worker" and why["live_workers"] == 0 and why["queue_workers"] == 0
    heartbeat(conn, "other", queues={"default": 2})
    assert explain(conn, jid)["live_workers"] == 1 and explain(conn, jid)["queue_workers"] == 0
    heartbeat(conn, "mailer", queues={"mail": 2}, kinds=["mail.digest"])
    why = explain(conn, jid)
    assert (why["reason"], why["kind"], why["queue_workers"]) == ("no_worker", "mail.send", 1)
    heartbeat(conn, "sender", queues=["mail"], kinds=["mail.send"], heartbeat_interval=2)
    assert explain(conn, jid)["reason"] == "claimable"
    # silent for more than three of its heartbeat intervals: stale, no longer serves; its last heartbeat is named
    conn.execute("UPDATE pgjobs.workers SET last_seen = now() - interval '7 seconds' WHERE id = 'sender'")
    why = explain(conn, jid)
    seen = conn.execute("SELECT last_seen FROM pgjobs.workers WHERE id = 'sender'").fetchone()
    assert seen is not None
    assert why["reason"] == "no_worker" and datetime.fromisoformat(why["last_seen"]) == seen[0]
    # a worker whose meta does not say what it serves may serve anything: not an answer of no_worker
    call(conn, "worker_heartbeat", worker="sql-worker", meta={})
    assert explain(conn, jid)["reason"] == "claimable"


def test_behind_others_counts_claimable_jobs_ahead_in_claim_order(conn: Conn) -> None:
    heartbeat(conn)
    ids = [enqueue(conn)["id"] for _ in range(3)]
    urgent = enqueue(conn, priority=-1)["id"]
    assert explain(conn, ids[2])["ahead"] == 3  # the urgent job sorts first
    assert explain(conn, urgent) == {"reason": "claimable", "queue": "default"}
    assert claim_one(conn)["id"] == urgent
    assert explain(conn, ids[2])["ahead"] == 2


def test_behind_others_stops_counting_at_a_thousand(conn: Conn) -> None:
    heartbeat(conn)
    ids = [r["id"] for r in call(conn, "enqueue_many", jobs=[{"kind": "k"}] * 1002)]
    assert explain(conn, ids[1000])["ahead"] == 1000 and explain(conn, ids[1000])["at_least"] is False
    why = explain(conn, ids[1001])
    assert (why["reason"], why["ahead"], why["at_least"]) == ("behind_others", 1000, True)


def test_behind_others_on_a_fair_queue_counts_the_jobs_own_group(conn: Conn) -> None:
    heartbeat(conn, queues={"f": 4})
    call(conn, "configure_queue", queue="f", fair=True)
    a = [enqueue(conn, queue="f", group_key="a")["id"] for _ in range(3)]
    b = enqueue(conn, queue="f", group_key="b")["id"]
    loose = [enqueue(conn, queue="f")["id"] for _ in range(2)]
    assert explain(conn, b) == {"reason": "claimable", "queue": "f"}
    assert explain(conn, a[2]) == {
        "reason": "behind_others", "queue": "f", "ahead": 2, "at_least": False, "fair": True, "group_key": "a",
    }  # fmt: skip
    assert explain(conn, loose[1])["ahead"] == 1 and explain(conn, loose[1])["group_key"] is None
    # groups take turns: the first claims serve the heads of a, b and the ungrouped jobs
    taken = {g["id"] for g in claim(conn, queues=["f"], max_jobs=3)}
    assert taken == {a[0], b, loose[0]}


def test_claimable_is_what_the_next_claim_takes(conn: Conn) -> None:
    heartbeat(conn)
    jid = enqueue(conn)["id"]
    due = enqueue(conn, run_at="2000-01-01T00:00:00Z")["id"]  # scheduled in the past: due, and first in order
    assert explain(conn, due) == {"reason": "claimable", "queue": "default"}
    assert explain(conn, jid)["ahead"] == 1
    assert [g["id"] for g in claim(conn, max_jobs=2)] == [due, jid]

"""Durable execution in SQL (sql/durable.sql): record_step, job_steps, sleep_until, await_signal, signal,
durable_status, called by name as any worker in any language would."""

from __future__ import annotations

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
    payloads,
    raises_pj,
    run_threads,
    scalar,
    snapshot,
)

Conn = psycopg.Connection[Any]


def started(conn: Conn, kind: str = "k", **kwargs: Any) -> dict[str, Any]:
    enqueue(conn, kind, **kwargs)
    return claim_one(conn)


def wait(conn: Conn, c: dict[str, Any], name: str, key: str, timeout: str | None = None) -> tuple[str, Any] | None:
    rows = conn.execute(
        "SELECT outcome, payload FROM pgjobs.await_signal(id => %s, lease_token => %s, name => %s, key => %s,"
        " timeout_at => now() + %s::interval)",
        [c["id"], c["lease_token"], name, key, timeout],
    ).fetchall()
    return (rows[0][0], rows[0][1]) if rows else None


def make_due(conn: Conn, id: int) -> None:
    conn.execute("UPDATE pgjobs.jobs SET run_at = now() - interval '1 second' WHERE id = %s", [id])
    conn.execute("UPDATE pgjobs.job_waits SET until = now() - interval '1 second' WHERE job_id = %s", [id])


def test_a_step_is_recorded_once_and_read_by_the_next_attempt(conn: Conn) -> None:
    c = started(conn)
    assert scalar(conn, "record_step", id=c["id"], lease_token=c["lease_token"], name="charge", result={"tx": 7})
    assert call(conn, "job_steps", id=c["id"], lease_token=c["lease_token"]) == [
        {"name": "charge", "result": {"tx": 7}}
    ]
    assert scalar(conn, "record_step", id=c["id"], lease_token=c["lease_token"], name="charge", result={"tx": 7})
    with raises_pj("PJ002", "'charge'", "already recorded"):
        scalar(conn, "record_step", id=c["id"], lease_token=c["lease_token"], name="charge", result={"tx": 8})
    # the next attempt (lease lost, reclaimed) reads it; the old token records nothing
    conn.execute("UPDATE pgjobs.jobs SET lease_expires_at = now() - interval '1 s' WHERE id = %s", [c["id"]])
    again = claim_one(conn)
    assert again["attempt"] == 2
    assert scalar(conn, "record_step", id=c["id"], lease_token=c["lease_token"], name="mail", result=1) is False
    assert call(conn, "job_steps", id=c["id"], lease_token=c["lease_token"]) == []
    assert [r["name"] for r in call(conn, "job_steps", id=c["id"], lease_token=again["lease_token"])] == ["charge"]


def test_step_limits_refuse_with_pj002_and_change_nothing(conn: Conn) -> None:
    c = started(conn)
    before = snapshot(conn)
    with raises_pj("PJ002", "'big'", "at most 1048576"):
        scalar(conn, "record_step", id=c["id"], lease_token=c["lease_token"], name="big", result="x" * 1_100_000)
    with raises_pj("PJ002", "name must be a non-empty string"):
        scalar(conn, "record_step", id=c["id"], lease_token=c["lease_token"], name="", result=1)
    conn.execute(
        "INSERT INTO pgjobs.job_steps (job_id, name, result, bytes, attempt)"
        " SELECT %s, 's' || i, '1', 1, 1 FROM generate_series(1, 1000) AS i",
        [c["id"]],
    )
    with raises_pj("PJ002", "at most 1000 steps"):
        scalar(conn, "record_step", id=c["id"], lease_token=c["lease_token"], name="one more", result=1)
    assert snapshot(conn) == before
    assert conn.execute("SELECT count(*) FROM pgjobs.job_steps").fetchone() == (1000,)


def test_sleep_parks_without_a_lease_or_an_attempt_then_resumes(conn: Conn) -> None:
    c = started(conn)
    out = conn.execute(
        "SELECT pgjobs.sleep_until(id => %s, lease_token => %s, name => 'sleep#1', until => now() + interval '1 hour')",
        [c["id"], c["lease_token"]],
    ).fetchone()
    assert out == ("parked",)
    row = job(conn, c["id"])
    assert (row["state"], row["lease_token"], row["attempt"]) == ("scheduled", None, 0)
    status = scalar(conn, "durable_status", id=c["id"])
    assert status["sleeping_until"] is not None and status["waiting_for"] is None
    make_due(conn, c["id"])
    again = claim_one(conn)
    assert again["attempt"] == 1
    out = conn.execute(
        "SELECT pgjobs.sleep_until(id => %s, lease_token => %s, name => 'sleep#1', until => now() + interval '1 hour')",
        [again["id"], again["lease_token"]],
    ).fetchone()
    assert out == ("slept",)  # the recorded end counts, not the new one
    assert scalar(conn, "durable_status", id=c["id"])["sleeping_until"] is None


def test_a_signal_wakes_every_waiter_with_its_payload(conn: Conn) -> None:
    a, b = started(conn), started(conn)
    assert wait(conn, a, "wait#1", "ship:1") == ("parked", None)
    assert wait(conn, b, "wait#1", "ship:1", "1 hour") == ("parked", None)
    assert (job(conn, a["id"])["state"], job(conn, b["id"])["state"]) == ("waiting", "scheduled")
    assert scalar(conn, "durable_status", id=a["id"])["waiting_for"]["key"] == "ship:1"
    listen(conn, "pgjobs_wake")
    assert scalar(conn, "signal", key="ship:1", payload={"carrier": "x"}) == 2
    assert payloads(drain(conn), "pgjobs_wake") == ["default"]
    assert {job(conn, i)["state"] for i in (a["id"], b["id"])} == {"pending"}
    # each resumes with the payload; a second signal wakes nobody and is kept
    for _ in range(2):
        c = claim_one(conn)
        assert wait(conn, c, "wait#1", "ship:1") == ("signal", {"carrier": "x"})
    assert scalar(conn, "signal", key="ship:1", payload={"late": 1}) == 0


def test_a_signal_sent_before_the_wait_is_kept_for_one_waiter(conn: Conn) -> None:
    assert scalar(conn, "signal", key="k1", payload={"n": 1}) == 0
    assert scalar(conn, "signal", key="k1", payload={"n": 2}) == 0
    a, b, c = started(conn), started(conn), started(conn)
    assert wait(conn, a, "w", "k1") == ("signal", {"n": 1})
    assert wait(conn, b, "w", "k1") == ("signal", {"n": 2})
    assert wait(conn, c, "w", "k1") == ("parked", None)
    # an expired one is not delivered
    conn.execute("UPDATE pgjobs.signals SET expires_at = now() WHERE false")
    assert scalar(conn, "signal", key="k2", payload={}, keep="00:00:01") == 0
    conn.execute("UPDATE pgjobs.signals SET expires_at = now() - interval '1 s' WHERE key = 'k2'")
    d = started(conn)
    assert wait(conn, d, "w", "k2") == ("parked", None)
    assert scalar(conn, "purge_signals") == 1


def test_a_wait_times_out_through_the_claim(conn: Conn) -> None:
    c = started(conn)
    assert wait(conn, c, "w", "never", "1 hour") == ("parked", None)
    make_due(conn, c["id"])
    again = claim_one(conn)
    assert wait(conn, again, "w", "never", "1 hour") == ("timeout", None)
    assert wait(conn, again, "w", "never") == ("timeout", None)  # resolved once


def test_a_signal_to_a_job_claimed_at_its_timeout_is_not_lost(conn: Conn) -> None:
    c = started(conn)
    wait(conn, c, "w", "race", "1 hour")
    make_due(conn, c["id"])
    again = claim_one(conn)
    assert scalar(conn, "signal", key="race", payload={"won": True}) == 1
    assert job(conn, c["id"])["state"] == "active"
    assert wait(conn, again, "w", "race", "1 hour") == ("signal", {"won": True})


def test_cancel_of_a_parked_job_ends_it_and_its_continuations(conn: Conn) -> None:
    rows = call(
        conn,
        "enqueue_many",
        jobs=[{"ref": "p", "kind": "k"}, {"ref": "c", "kind": "k", "depends_on": [{"ref": "p", "on": "success"}]}],
    )
    parent, child = (r["id"] for r in rows)
    c = claim_one(conn)
    assert c["id"] == parent
    wait(conn, c, "w", "order:9")
    assert scalar(conn, "cancel", id=parent) is True
    assert (job(conn, parent)["state"], job(conn, child)["state"]) == ("cancelled", "cancelled")
    assert scalar(conn, "signal", key="order:9") == 0  # a cancelled job is no waiter: the signal is kept
    s = started(conn)
    sleep = conn.execute(
        "SELECT pgjobs.sleep_until(%s, %s, 's', now() + interval '1 hour')", [s["id"], s["lease_token"]]
    ).fetchone()
    assert sleep == ("parked",)
    assert scalar(conn, "cancel", id=s["id"]) is True and job(conn, s["id"])["state"] == "cancelled"


def test_a_park_after_a_cancel_request_ends_the_job_cancelled(conn: Conn) -> None:
    c = started(conn)
    scalar(conn, "cancel", id=c["id"])
    assert wait(conn, c, "w", "k") == ("cancelled", None)
    assert job(conn, c["id"])["state"] == "cancelled"


def test_bad_arguments(conn: Conn) -> None:
    c = started(conn)
    with raises_pj("PJ002", "key must be a non-empty string"):
        scalar(conn, "signal", key="")
    with raises_pj("PJ002", "payload must be JSON"):
        conn.execute("SELECT pgjobs.signal('k', NULL)")
    with raises_pj("PJ002", "keep"):
        scalar(conn, "signal", key="k", payload={}, keep="-1 second")
    wait(conn, c, "w", "k")
    scalar(conn, "signal", key="k", payload={})
    again = claim_one(conn)
    with raises_pj("PJ002", "'w'", "unique within its job"):
        conn.execute("SELECT pgjobs.sleep_until(%s, %s, 'w', now())", [again["id"], again["lease_token"]])


@pytest.mark.parametrize("order", ["same order", "reverse order"])
def test_signal_racing_a_wait_is_delivered_once(connect: Any, conn: Conn, order: str) -> None:
    """50 jobs, each waiting on its own key while a second connection sends the keys' signals at the same
    time (in the same order: each signal just before or after its wait; reversed: the first half before,
    the rest after): every job gets its payload exactly once, at once from a kept signal or parked and woken."""
    jobs = [started(conn) for _ in range(50)]
    conns = [connect(autocommit=True) for _ in range(2)]
    keys = list(range(50)) if order == "same order" else list(reversed(range(50)))

    def run(i: int) -> list[Any]:
        if i == 0:
            return [wait(conns[0], c, "w", f"race:{n}") for n, c in enumerate(jobs)]
        return [scalar(conns[1], "signal", key=f"race:{n}", payload={"n": n}) for n in keys]

    waits, woke = run_threads(2, run)
    got = {n: r[1] for n, r in enumerate(waits) if r[0] == "signal"}
    assert all(r[0] in ("signal", "parked") for r in waits)
    assert sum(woke) == sum(1 for r in waits if r[0] == "parked")
    # the parked ones were woken: their resumed wait returns the payload
    by_id = {c["id"]: n for n, c in enumerate(jobs)}
    while rows := call(conn, "claim", worker="w", max_jobs=50):
        for c in rows:
            n = by_id[c["id"]]
            r = wait(conn, c, "w", f"race:{n}")
            assert r is not None and r[0] == "signal" and n not in got
            got[n] = r[1]
    assert got == {n: {"n": n} for n in range(50)}
    assert conn.execute("SELECT count(*) FROM pgjobs.signals").fetchone() == (0,)


def test_park_and_wake_are_status_events(conn: Conn) -> None:
    waiter, sleeper = started(conn), started(conn)
    wait(conn, waiter, "w", "ev:1")
    conn.execute(
        "SELECT pgjobs.sleep_until(%s, %s, 's', now() + interval '1 hour')", [sleeper["id"], sleeper["lease_token"]]
    )
    scalar(conn, "signal", key="ev:1", payload={})
    rows = call(conn, "read_events", after_id=0, job_ids=[waiter["id"], sleeper["id"]])
    got = [(r["id"], r["state"], r["attempt"]) for r in rows]
    assert got == [
        (waiter["id"], "pending", 0),
        (waiter["id"], "active", 1),
        (sleeper["id"], "pending", 0),
        (sleeper["id"], "active", 1),
        (waiter["id"], "waiting", 0),  # parked, the attempt given back
        (sleeper["id"], "scheduled", 0),
        (waiter["id"], "pending", 0),  # woken by the signal
    ]
    status = call(conn, "job_status", id=waiter["id"])[0]
    assert (status["state"], status["lease_token"]) == ("pending", None)


def test_a_jobs_steps_and_waits_go_with_it(conn: Conn) -> None:
    kept, gone, purged = started(conn), started(conn), started(conn)
    for c in (kept, gone, purged):
        assert scalar(conn, "record_step", id=c["id"], lease_token=c["lease_token"], name="s", result=1)
        wait(conn, c, "w", f"gc:{c['id']}")
        scalar(conn, "cancel", id=c["id"])
    assert scalar(conn, "delete", id=gone["id"]) is True
    conn.execute("UPDATE pgjobs.jobs SET completed_at = now() - interval '2 days' WHERE id = %s", [purged["id"]])
    assert scalar(conn, "purge", succeeded_before="1 day", failed_before="1 day") == 1
    left = conn.execute("SELECT DISTINCT job_id FROM pgjobs.job_steps UNION SELECT job_id FROM pgjobs.job_waits")
    assert [r[0] for r in left.fetchall()] == [kept["id"]]


def test_parked_jobs_of_a_fair_queue_are_claimed_again(conn: Conn) -> None:
    scalar(conn, "configure_queue", queue="fair", fair=True)
    enqueue(conn, "k", queue="fair", group_key="tenant-a")
    enqueue(conn, "k", queue="fair", group_key="tenant-b")
    a, b = sorted(call(conn, "claim", worker="w", queues=["fair"], max_jobs=2), key=lambda r: r["id"])
    wait(conn, a, "w", "fair:a")
    conn.execute("SELECT pgjobs.sleep_until(%s, %s, 's', now() + interval '1 hour')", [b["id"], b["lease_token"]])
    assert call(conn, "claim", worker="w", queues=["fair"]) == []
    assert scalar(conn, "signal", key="fair:a", payload={"go": 1}) == 1
    make_due(conn, b["id"])
    got = sorted(r["id"] for r in call(conn, "claim", worker="w", queues=["fair"], max_jobs=5))
    assert got == sorted([a["id"], b["id"]])


def test_explain_names_what_a_parked_job_waits_for(conn: Conn) -> None:
    """A job parked on a signal says so through explain (its reason stays the state's: waiting, or scheduled
    with a timeout), and so does a sleeping one; once the signal comes, the parked detail is gone."""
    from pgjobs.client.explain import Explanation

    waiter = started(conn)
    assert wait(conn, waiter, "ship", "shipped:7") == ("parked", None)
    why = scalar(conn, "explain", id=waiter["id"])
    assert why["reason"] == "waiting_dependencies" and why["waiting_on"] == []
    assert why["parked"]["kind"] == "signal" and why["parked"]["key"] == "shipped:7"
    assert why["parked"]["until"] is None
    assert "waiting for signal 'shipped:7'" in Explanation.from_json(waiter["id"], why).describe()

    sleeper = started(conn)
    conn.execute(
        "SELECT pgjobs.sleep_until(%s, %s, 'nap', now() + interval '1 hour')", [sleeper["id"], sleeper["lease_token"]]
    )
    why = scalar(conn, "explain", id=sleeper["id"])
    assert why["reason"] == "scheduled" and why["parked"]["kind"] == "sleep" and why["parked"]["name"] == "nap"
    assert Explanation.from_json(sleeper["id"], why).describe().startswith("sleeping ('nap') until")

    assert scalar(conn, "signal", key="shipped:7", payload={}) == 1
    why = scalar(conn, "explain", id=waiter["id"])
    assert "parked" not in why and why["reason"] in ("claimable", "no_worker", "behind_others")

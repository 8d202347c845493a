"""Recurring schedules in SQL (sql/recurring.sql) and their client methods: validation (PJ002), unknown
names (PJ003), code-defined vs dynamic (PJ004), due_schedules, and materialize_schedule(s) exactly once."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from pgjobs import Client, InvalidArgument, InvalidState, JobNotFound, QueueFull
from pgjobs.client.recurring import PeriodicSpec, Run

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def upsert(conn: psycopg.Connection[Any], name: str, next_run_at: datetime = T0, **kw: Any) -> dict[str, Any]:
    args = {
        "name": name,
        "kind": kw.pop("kind", "tick"),
        "cron": kw.pop("cron", "* * * * *"),
        "next_run_at": next_run_at,
    }
    args.update(kw)
    placeholders = ", ".join(f"{k} => %({k})s" for k in args)
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(f"SELECT * FROM pgjobs.upsert_schedule({placeholders})", args)  # type: ignore[arg-type]
        row = cur.fetchone()
    assert row is not None
    return row


def schedule(conn: psycopg.Connection[Any], name: str) -> dict[str, Any] | None:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute("SELECT * FROM pgjobs.schedules WHERE name = %s", (name,)).fetchone()


def jobs_of(conn: psycopg.Connection[Any], name: str) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute("SELECT * FROM pgjobs.jobs WHERE schedule_name = %s ORDER BY run_at", (name,)).fetchall()


def materialize(conn: psycopg.Connection[Any], name: str, expected: datetime, nxt: datetime) -> int | None:
    row = conn.execute(
        "SELECT pgjobs.materialize_schedule(name => %s, expected_run_at => %s, next_run_at => %s)",
        (name, expected, nxt),
    ).fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def sqlstate_of(conn: psycopg.Connection[Any], query: str, params: Any = None) -> tuple[str | None, str]:
    with pytest.raises(psycopg.Error) as info:
        conn.execute(query, params)  # type: ignore[arg-type]
    return info.value.sqlstate, info.value.diag.message_primary or ""


# -- upsert, validation ------------------------------------------------------------------------------------


@pytest.mark.smoke
def test_upsert_creates_then_updates_a_schedule(conn: psycopg.Connection[Any]) -> None:
    row = upsert(conn, "report", cron="*/5 * * * *", timezone="Europe/Paris", payload='{"a": 1}', queue="q")
    assert row["kind"] == "tick" and row["cron"] == "*/5 * * * *" and row["timezone"] == "Europe/Paris"
    assert row["payload"] == {"a": 1} and row["queue"] == "q" and row["next_run_at"] == T0
    assert row["code_defined"] is False and row["paused"] is False and row["missed"] == "once"
    assert row["priority"] == 0 and row["max_attempts"] == 20 and row["last_run_at"] is None

    row = upsert(conn, "report", T0 + timedelta(hours=1), kind="other", cron="0 * * * *", priority=3, max_attempts=2)
    assert row["kind"] == "other" and row["cron"] == "0 * * * *" and row["timezone"] == "UTC"
    assert row["next_run_at"] == T0 + timedelta(hours=1) and row["priority"] == 3 and row["max_attempts"] == 2
    assert conn.execute("SELECT count(*) FROM pgjobs.schedules").fetchone() == (1,)


def test_positional_contract_signature(conn: psycopg.Connection[Any]) -> None:
    # upsert_schedule(name, kind, cron, next_run_at, timezone, payload, queue, code_defined)
    conn.execute(
        "SELECT pgjobs.upsert_schedule('p', 'k', '* * * * *', %s, 'America/New_York', '{\"x\": 2}', 'q', true)", (T0,)
    )
    row = schedule(conn, "p")
    assert row is not None and row["timezone"] == "America/New_York" and row["code_defined"] is True
    assert row["payload"] == {"x": 2} and row["queue"] == "q"
    due = conn.execute("SELECT name FROM pgjobs.due_schedules(%s, 10)", (T0,)).fetchall()
    assert due == [("p",)]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ({"name": ""}, "name"),
        ({"name": None}, "NULL"),
        ({"kind": ""}, "kind"),
        ({"cron": ""}, "cron"),
        ({"cron": "   "}, "cron"),
        ({"next_run_at": None}, "next_run_at"),
        ({"timezone": "Mars/Olympus"}, "Mars/Olympus"),
        ({"timezone": ""}, "timezone"),
        ({"queue": ""}, "queue"),
        ({"payload": None}, "payload"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"missed": "twice"}, "twice"),
        ({"priority": 40000}, "40000"),
    ],
)
def test_upsert_rejects_bad_input_with_pj002(conn: psycopg.Connection[Any], args: dict[str, Any], needle: str) -> None:
    full: dict[str, Any] = {"name": "s", "kind": "k", "cron": "* * * * *", "next_run_at": T0} | args
    placeholders = ", ".join(f"{k} => %({k})s" for k in full)
    state, message = sqlstate_of(conn, f"SELECT pgjobs.upsert_schedule({placeholders})", full)
    assert state == "PJ002"
    assert needle in message
    assert conn.execute("SELECT count(*) FROM pgjobs.schedules").fetchone() == (0,)


def test_due_schedules_rejects_negative_max_rows(conn: psycopg.Connection[Any]) -> None:
    state, message = sqlstate_of(conn, "SELECT * FROM pgjobs.due_schedules(now(), -1)")
    assert state == "PJ002" and "-1" in message


@pytest.mark.parametrize("fn", ["pause_schedule", "resume_schedule", "remove_schedule"])
def test_unknown_schedule_raises_pj003(conn: psycopg.Connection[Any], fn: str) -> None:
    state, message = sqlstate_of(conn, f"SELECT pgjobs.{fn}(name => 'ghost')")  # type: ignore[str-bytes-safe]
    assert state == "PJ003" and "ghost" in message


def test_keep_next_run_at_keeps_the_pending_run_only_when_cron_and_zone_are_unchanged(
    conn: psycopg.Connection[Any],
) -> None:
    upsert(conn, "s", T0)
    assert upsert(conn, "s", T0 + timedelta(days=1), keep_next_run_at=True)["next_run_at"] == T0
    assert upsert(conn, "s", T0 + timedelta(days=1), payload='{"v": 2}', keep_next_run_at=True)["next_run_at"] == T0
    changed = upsert(conn, "s", T0 + timedelta(days=1), cron="*/2 * * * *", keep_next_run_at=True)
    assert changed["next_run_at"] == T0 + timedelta(days=1)
    rezoned = upsert(
        conn, "s", T0 + timedelta(days=2), cron="*/2 * * * *", timezone="Asia/Tokyo", keep_next_run_at=True
    )
    assert rezoned["next_run_at"] == T0 + timedelta(days=2)
    # without the flag, the given next_run_at is taken as is
    assert upsert(conn, "s", T0, cron="*/2 * * * *", timezone="Asia/Tokyo")["next_run_at"] == T0


# -- code-defined vs dynamic -------------------------------------------------------------------------------


@pytest.mark.smoke
def test_dynamic_upsert_never_replaces_a_code_defined_schedule(conn: psycopg.Connection[Any]) -> None:
    upsert(conn, "nightly", cron="0 3 * * *", code_defined=True)
    state, message = sqlstate_of(
        conn,
        "SELECT pgjobs.upsert_schedule('nightly', 'other', '* * * * *', %s)",
        (T0 + timedelta(days=9),),
    )
    assert state == "PJ004" and "nightly" in message
    row = schedule(conn, "nightly")
    assert row is not None and row["kind"] == "tick" and row["cron"] == "0 3 * * *" and row["code_defined"]
    # a code-defined declaration may update it
    assert upsert(conn, "nightly", cron="0 4 * * *", code_defined=True)["cron"] == "0 4 * * *"


def test_code_defined_upsert_takes_over_a_dynamic_schedule(conn: psycopg.Connection[Any]) -> None:
    upsert(conn, "x", cron="0 3 * * *")
    row = upsert(conn, "x", cron="0 5 * * *", code_defined=True)
    assert row["code_defined"] is True and row["cron"] == "0 5 * * *"


def test_remove_deletes_dynamic_but_not_code_defined_schedules(conn: psycopg.Connection[Any]) -> None:
    upsert(conn, "dyn")
    upsert(conn, "code", code_defined=True)
    assert conn.execute("SELECT pgjobs.remove_schedule('dyn')").fetchone() == (True,)
    assert schedule(conn, "dyn") is None
    state, _ = sqlstate_of(conn, "SELECT pgjobs.remove_schedule('code')")
    assert state == "PJ004"
    assert schedule(conn, "code") is not None
    assert conn.execute("SELECT pgjobs.remove_schedule('code', force => true)").fetchone() == (True,)
    assert schedule(conn, "code") is None


def test_prune_deletes_only_undeclared_code_defined_schedules(conn: psycopg.Connection[Any]) -> None:
    for name in ("a", "b", "c"):
        upsert(conn, name, code_defined=True)
    upsert(conn, "dynamic")
    assert conn.execute("SELECT pgjobs.prune_code_schedules(ARRAY['a', 'zzz'])").fetchone() == (2,)
    names = [r[0] for r in conn.execute("SELECT name FROM pgjobs.schedules ORDER BY name")]
    assert names == ["a", "dynamic"]
    assert conn.execute("SELECT pgjobs.prune_code_schedules('{}')").fetchone() == (1,)
    state, _ = sqlstate_of(conn, "SELECT pgjobs.prune_code_schedules(NULL)")
    assert state == "PJ002"
    assert [r[0] for r in conn.execute("SELECT name FROM pgjobs.schedules")] == ["dynamic"]


# -- due_schedules, pause, resume --------------------------------------------------------------------------


def test_due_schedules_returns_unpaused_schedules_due_by_now(conn: psycopg.Connection[Any]) -> None:
    upsert(conn, "late", T0 - timedelta(minutes=5))
    upsert(conn, "now", T0)
    upsert(conn, "future", T0 + timedelta(seconds=1))
    upsert(conn, "paused", T0 - timedelta(hours=1))
    conn.execute("SELECT pgjobs.pause_schedule('paused')")
    due = [r[0] for r in conn.execute("SELECT name FROM pgjobs.due_schedules(now => %s, max_rows => 10)", (T0,))]
    assert due == ["late", "now"]
    assert [r[0] for r in conn.execute("SELECT name FROM pgjobs.due_schedules(%s, 1)", (T0,))] == ["late"]
    assert conn.execute("SELECT count(*) FROM pgjobs.due_schedules(%s, 0)", (T0,)).fetchone() == (0,)


def test_pause_and_resume(conn: psycopg.Connection[Any]) -> None:
    upsert(conn, "s", T0)
    assert conn.execute("SELECT pgjobs.pause_schedule('s')").fetchone() == (True,)
    assert conn.execute("SELECT pgjobs.pause_schedule('s')").fetchone() == (False,)  # already paused
    assert conn.execute("SELECT count(*) FROM pgjobs.due_schedules(%s, 10)", (T0,)).fetchone() == (0,)
    assert materialize(conn, "s", T0, T0 + timedelta(minutes=1)) is None  # a paused schedule does not run
    assert conn.execute("SELECT pgjobs.resume_schedule('s')").fetchone() == (True,)
    row = schedule(conn, "s")
    assert row is not None and (row["paused"], row["next_run_at"]) == (False, T0)  # the old run stays due
    conn.execute("SELECT pgjobs.pause_schedule('s')")
    later = T0 + timedelta(days=1)
    assert conn.execute("SELECT pgjobs.resume_schedule('s', %s)", (later,)).fetchone() == (True,)
    assert schedule(conn, "s")["next_run_at"] == later  # type: ignore[index]
    # resuming a schedule that is not paused changes nothing
    assert conn.execute("SELECT pgjobs.resume_schedule('s', %s)", (T0,)).fetchone() == (False,)
    assert schedule(conn, "s")["next_run_at"] == later  # type: ignore[index]


def test_schedule_changes_are_notified(conn: psycopg.Connection[Any], connect: Any) -> None:
    listener = connect()
    listener.execute("LISTEN pgjobs_schedules")
    upsert(conn, "s")
    conn.execute("SELECT pgjobs.pause_schedule('s')")
    conn.execute("SELECT pgjobs.resume_schedule('s')")
    upsert(conn, "c", code_defined=True)
    conn.execute("SELECT pgjobs.prune_code_schedules('{}')")
    conn.execute("SELECT pgjobs.remove_schedule('s')")
    got = [n.payload for n in listener.notifies(timeout=30.0, stop_after=6)]  # (ends at the sixth)
    assert got == ["s", "s", "s", "c", "*", "s"]


# -- materialize_schedule ----------------------------------------------------------------------------------


@pytest.mark.smoke
def test_materialize_inserts_the_run_and_advances_exactly_once(conn: psycopg.Connection[Any]) -> None:
    upsert(conn, "s", T0, kind="report", payload='{"p": 1}', queue="reports", priority=-2, max_attempts=3)
    nxt = T0 + timedelta(minutes=1)
    job_id = materialize(conn, "s", T0, nxt)
    assert job_id is not None
    assert materialize(conn, "s", T0, nxt) is None  # the same run again: a loser
    [job] = jobs_of(conn, "s")
    assert job["id"] == job_id and job["kind"] == "report" and job["queue"] == "reports"
    assert job["payload"] == {"p": 1} and job["priority"] == -2 and job["max_attempts"] == 3
    assert job["run_at"] == T0 and job["state"] == "scheduled"  # T0 (2030) is in the future
    assert job["unique_key"] == "schedule:s@2030-01-01T00:00:00.000000Z"
    assert job["meta"]["schedule"] == "s"
    row = schedule(conn, "s")
    assert row is not None
    assert (row["next_run_at"], row["last_run_at"], row["last_job_id"]) == (nxt, T0, job_id)


def test_materialize_losers_and_bad_input(conn: psycopg.Connection[Any]) -> None:
    upsert(conn, "s", T0)
    assert materialize(conn, "s", T0 - timedelta(minutes=1), T0 + timedelta(minutes=1)) is None  # stale run
    assert materialize(conn, "ghost", T0, T0 + timedelta(minutes=1)) is None  # removed meanwhile
    for bad_next in (T0, T0 - timedelta(seconds=1)):
        state, message = sqlstate_of(conn, "SELECT pgjobs.materialize_schedule('s', %s, %s)", (T0, bad_next))
        assert state == "PJ002" and "next_run_at" in message
    state, _ = sqlstate_of(conn, "SELECT pgjobs.materialize_schedule('s', NULL, %s)", (T0,))
    assert state == "PJ002"
    assert jobs_of(conn, "s") == []


def test_due_run_is_enqueued_pending(conn: psycopg.Connection[Any]) -> None:
    past = datetime.now(UTC) - timedelta(minutes=2)
    upsert(conn, "s", past)
    job_id = materialize(conn, "s", past, past + timedelta(minutes=5))
    row = conn.execute("SELECT state, run_at FROM pgjobs.jobs WHERE id = %s", (job_id,)).fetchone()
    assert row == ("pending", past)


def test_a_run_set_back_is_never_enqueued_twice(conn: psycopg.Connection[Any]) -> None:
    """The second fence: the unique key per (schedule, run time) holds even when the schedule itself is
    set back to a run that was already materialised (e.g. by a stale upsert)."""
    upsert(conn, "s", T0)
    first = materialize(conn, "s", T0, T0 + timedelta(minutes=1))
    upsert(conn, "s", T0)  # set back
    assert materialize(conn, "s", T0, T0 + timedelta(minutes=1)) is None
    assert [j["id"] for j in jobs_of(conn, "s")] == [first]
    row = schedule(conn, "s")
    assert row is not None and row["next_run_at"] == T0 + timedelta(minutes=1) and row["last_job_id"] == first


def test_a_rolled_back_materialisation_leaves_nothing(connect: Any) -> None:
    conn = connect()
    upsert(conn, "s", T0)
    tx = connect(autocommit=False)
    assert materialize(tx, "s", T0, T0 + timedelta(minutes=1)) is not None
    tx.rollback()
    row = schedule(conn, "s")
    assert row is not None and row["next_run_at"] == T0 and row["last_job_id"] is None
    assert jobs_of(conn, "s") == []
    assert materialize(conn, "s", T0, T0 + timedelta(minutes=1)) is not None
    assert len(jobs_of(conn, "s")) == 1


def test_racing_materialisations_have_one_winner(connect: Any) -> None:
    setup = connect()
    names = [f"s{i}" for i in range(20)]
    for name in names:
        upsert(setup, name, T0)
    threads = 8
    barrier = threading.Barrier(threads)
    wins: list[tuple[str, int]] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def racer() -> None:
        try:
            conn = connect()
            barrier.wait()
            for name in names:
                job = materialize(conn, name, T0, T0 + timedelta(minutes=1))
                if job is not None:
                    with lock:
                        wins.append((name, job))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    pool = [threading.Thread(target=racer) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert errors == []
    assert sorted(n for n, _ in wins) == sorted(names)  # each run exactly one winner
    counts = setup.execute("SELECT schedule_name, count(*) FROM pgjobs.jobs GROUP BY 1").fetchall()
    assert sorted(counts) == [(n, 1) for n in sorted(names)]


def test_materialize_into_a_full_queue_changes_nothing(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT pgjobs.configure_queue('small', max_length => 1)")
    conn.execute("SELECT pgjobs.enqueue('filler', queue => 'small')")
    upsert(conn, "s", T0, queue="small")
    state, _ = sqlstate_of(conn, "SELECT pgjobs.materialize_schedule('s', %s, %s)", (T0, T0 + timedelta(minutes=1)))
    assert state == "PJ001"
    row = schedule(conn, "s")
    assert row is not None and row["next_run_at"] == T0  # still due: retried when the queue has room


def test_materialize_notifies_the_queue(conn: psycopg.Connection[Any], connect: Any) -> None:
    listener = connect()
    listener.execute("LISTEN pgjobs_wake")
    past = datetime.now(UTC) - timedelta(seconds=5)
    upsert(conn, "s", past, queue="mail")
    materialize(conn, "s", past, past + timedelta(minutes=1))
    assert [n.payload for n in listener.notifies(timeout=30.0, stop_after=1)] == ["mail"]


# -- materialize_schedules (the scheduler's batch form) ----------------------------------------------------


def batch(conn: psycopg.Connection[Any], runs: list[tuple[str, datetime, datetime, bool]]) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            "SELECT * FROM pgjobs.materialize_schedules(%s::text[], %s::timestamptz[],"
            " %s::timestamptz[], %s::boolean[])",
            ([r[0] for r in runs], [r[1] for r in runs], [r[2] for r in runs], [r[3] for r in runs]),
        ).fetchall()


def test_materialize_schedules_runs_skips_and_ignores_stale_runs(conn: psycopg.Connection[Any]) -> None:
    nxt = T0 + timedelta(hours=1)
    for name in ("a", "b", "c"):
        upsert(conn, name, T0)
    rows = batch(conn, [("a", T0, nxt, False), ("b", T0, nxt, True), ("c", T0 - timedelta(minutes=1), nxt, False)])
    assert [(r["name"], r["job_id"] is not None, r["created"]) for r in rows] == [
        ("a", True, True),
        ("b", False, False),
    ]
    assert len(jobs_of(conn, "a")) == 1 and jobs_of(conn, "b") == [] and jobs_of(conn, "c") == []
    b = schedule(conn, "b")
    assert b is not None and b["next_run_at"] == nxt and b["last_run_at"] is None  # skipped: no run recorded
    c = schedule(conn, "c")
    assert c is not None and c["next_run_at"] == T0
    assert batch(conn, [("a", T0, nxt, False)]) == []  # already advanced


def test_materialize_schedules_skips_rows_locked_by_another_scheduler(connect: Any) -> None:
    conn = connect()
    nxt = T0 + timedelta(hours=1)
    upsert(conn, "a", T0)
    upsert(conn, "b", T0)
    other = connect(autocommit=False)
    locked = other.execute("SELECT name FROM pgjobs.due_schedules(%s, 1, skip_locked => true)", (T0,)).fetchall()
    assert locked == [("a",)]
    # a second scheduler does not wait for 'a': it gets 'b' and skips 'a'
    assert [r[0] for r in conn.execute("SELECT name FROM pgjobs.due_schedules(%s, 10, true)", (T0,))] == ["b"]
    rows = batch(conn, [("a", T0, nxt, False), ("b", T0, nxt, False)])
    assert [r["name"] for r in rows] == ["b"]
    other.rollback()  # the first scheduler died: 'a' is still due
    assert [r["name"] for r in batch(conn, [("a", T0, nxt, False)])] == ["a"]
    other.close()


def test_materialize_schedules_validates(conn: psycopg.Connection[Any]) -> None:
    upsert(conn, "a", T0)
    nxt = T0 + timedelta(minutes=1)
    for runs in ([("a", T0, nxt, False), ("a", T0, nxt, False)], [("a", T0, T0, False)], [("", T0, nxt, False)]):
        with pytest.raises(psycopg.Error) as info:
            batch(conn, runs)
        assert info.value.sqlstate == "PJ002"
    state, _ = sqlstate_of(
        conn, "SELECT * FROM pgjobs.materialize_schedules(ARRAY['a'], ARRAY[%s::timestamptz], '{}')", (T0,)
    )
    assert state == "PJ002"


# -- the Python client -------------------------------------------------------------------------------------


def test_client_schedule_methods(dsn: str) -> None:
    with Client(dsn) as client:
        s = client.add_schedule("hourly", "report", "0 * * * *", timezone="Asia/Kolkata", now=T0)
        assert s.next_run_at == datetime(2030, 1, 1, 0, 30, tzinfo=UTC)  # Kolkata is UTC+05:30
        again = client.add_schedule(
            "hourly", "report", "0 * * * *", timezone="Asia/Kolkata", now=T0 + timedelta(days=1)
        )
        assert again.next_run_at == s.next_run_at  # re-adding keeps the pending run
        assert client.get_schedule("hourly") == again and client.get_schedule("nope") is None
        assert [x.name for x in client.due_schedules(T0 + timedelta(hours=1))] == ["hourly"]
        job = client.materialize_schedule("hourly", s.next_run_at, s.next_run_at + timedelta(hours=1))
        assert job is not None
        assert client.materialize_schedule("hourly", s.next_run_at, s.next_run_at + timedelta(hours=1)) is None
        done = client.materialize_schedules([Run("hourly", s.next_run_at + timedelta(hours=1), T0 + timedelta(days=3))])
        assert len(done) == 1 and done[0].created and done[0].job_id is not None

        assert client.pause_schedule("hourly") is True
        assert client.get_schedule("hourly").paused  # type: ignore[union-attr]
        assert client.resume_schedule("hourly", now=T0 + timedelta(days=10, minutes=5)) is True
        resumed = client.get_schedule("hourly")
        assert resumed is not None and not resumed.paused
        assert resumed.next_run_at == T0 + timedelta(days=10, minutes=30)
        assert client.resume_schedule("hourly") is False
        client.pause_schedule("hourly")
        assert client.resume_schedule("hourly", catch_up=True) is True
        assert client.get_schedule("hourly").next_run_at == resumed.next_run_at  # type: ignore[union-attr]

        with pytest.raises(InvalidArgument, match="cron"):
            client.add_schedule("bad", "k", "every day")
        with pytest.raises(InvalidArgument, match="Mars/Olympus"):
            client.add_schedule("bad", "k", "* * * * *", timezone="Mars/Olympus")
        with pytest.raises(InvalidArgument, match="never fires"):
            client.add_schedule("bad", "k", "0 0 30 2 *")
        with pytest.raises(JobNotFound):
            client.pause_schedule("nope")
        client.upsert_schedule("code", "k", "* * * * *", T0, code_defined=True)
        with pytest.raises(InvalidState):
            client.add_schedule("code", "k", "*/2 * * * *")
        with pytest.raises(InvalidState):
            client.remove_schedule("code")
        assert client.remove_schedule("hourly") is True
        assert client.prune_code_schedules([]) == 1
        assert client.list_schedules() == []


def test_client_materialize_into_full_queue_raises_queue_full(dsn: str) -> None:
    with Client(dsn) as client:
        client.configure_queue("small", max_length=1)
        client.enqueue("filler", queue="small")
        client.upsert_schedule("s", "k", "* * * * *", T0, queue="small")
        with pytest.raises(QueueFull):
            client.materialize_schedule("s", T0, T0 + timedelta(minutes=1))


def test_periodic_spec_validates() -> None:
    spec = PeriodicSpec(name="cleanup", cron="*/5 * * * *", timezone="Europe/Paris")
    assert spec.kind == "cleanup" and spec.missed == "once" and spec.queue == "default"
    with pytest.raises(InvalidArgument):
        PeriodicSpec(name="x", cron="61 * * * *")
    with pytest.raises(InvalidArgument):
        PeriodicSpec(name="x", cron="* * * * *", timezone="Nowhere/City")
    with pytest.raises(InvalidArgument):
        PeriodicSpec(name="x", cron="* * * * *", missed="twice")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        PeriodicSpec(name="", cron="* * * * *")

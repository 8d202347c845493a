"""The recurring contract of DESIGN.md, checked as an outsider would.

`upsert_schedule`, `pause_schedule`, `resume_schedule`, `remove_schedule`, `prune_code_schedules`,
`due_schedules(now, max_rows)`, `materialize_schedule(name, expected_run_at, next_run_at) -> bigint`
(exactly once however many schedulers race, NULL for the losers), and "a dynamic schedule never replaces a
code-defined one of the same name" (PJ004). Every call is by contract name with named arguments.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

Conn = psycopg.Connection[Any]
T0 = datetime(2031, 3, 4, 5, 6, tzinfo=UTC)
MIN = timedelta(minutes=1)


def q(conn: Conn, query: str, params: Any = None) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query, params)
        return cur.fetchall() if cur.description else []


def scalar(conn: Conn, query: str, params: Any = None) -> Any:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def upsert(conn: Conn, name: str, **kw: Any) -> None:
    args: dict[str, Any] = {"name": name, "kind": "tick", "cron": "* * * * *", "next_run_at": T0} | kw
    if isinstance(args.get("payload"), dict):
        args["payload"] = Jsonb(args["payload"])
    named = ", ".join(f"{k} => %({k})s" for k in args)
    conn.execute(f"SELECT pgjobs.upsert_schedule({named})", args)


def schedules(conn: Conn) -> list[dict[str, Any]]:
    return q(conn, "SELECT * FROM pgjobs.schedules ORDER BY name")


def sched(conn: Conn, name: str) -> dict[str, Any]:
    found = [r for r in schedules(conn) if r["name"] == name]
    assert len(found) == 1, name
    return found[0]


def due(conn: Conn, now: datetime, max_rows: int = 100) -> list[str]:
    return [
        r["name"] for r in q(conn, "SELECT * FROM pgjobs.due_schedules(now => %s, max_rows => %s)", (now, max_rows))
    ]


def materialize(conn: Conn, name: str, expected: datetime, nxt: datetime) -> int | None:
    return scalar(  # type: ignore[no-any-return]
        conn,
        "SELECT pgjobs.materialize_schedule(name => %s, expected_run_at => %s, next_run_at => %s)",
        (name, expected, nxt),
    )


def refused(conn: Conn, sqlstate: str, query: str, params: Any = None) -> str:
    before = (schedules(conn), scalar(conn, "SELECT count(*) FROM pgjobs.jobs"))
    with pytest.raises(psycopg.Error) as info:
        conn.execute(query, params)
    assert info.value.sqlstate == sqlstate, (info.value.sqlstate, str(info.value))
    assert (schedules(conn), scalar(conn, "SELECT count(*) FROM pgjobs.jobs")) == before, (
        "a refused call changed something"
    )
    return str(info.value)


# --- upsert / due ----------------------------------------------------------------------------------------


def _upsert_with_every_named_argument_then_due_and_materialize(conn: Conn) -> None:
    upsert(
        conn,
        "nightly",
        kind="report",
        cron="0 3 * * *",
        next_run_at=T0,
        timezone="Europe/Paris",
        payload={"scope": "all"},
        queue="reports",
        code_defined=False,
    )
    row = sched(conn, "nightly")
    assert (row["name"], row["kind"], row["cron"], row["timezone"], row["payload"], row["queue"]) == (
        "nightly",
        "report",
        "0 3 * * *",
        "Europe/Paris",
        {"scope": "all"},
        "reports",
    )
    assert (row["code_defined"], row["paused"], row["next_run_at"], row["last_run_at"]) == (False, False, T0, None)

    assert due(conn, T0 - timedelta(microseconds=1)) == []
    assert due(conn, T0) == ["nightly"]  # next_run_at <= now
    job = materialize(conn, "nightly", T0, T0 + timedelta(days=1))
    assert isinstance(job, int)
    j = q(conn, "SELECT * FROM pgjobs.job_status(id => %s)", (job,))[0]
    assert (j["kind"], j["queue"], j["payload"], j["schedule_name"], j["run_at"]) == (
        "report",
        "reports",
        {"scope": "all"},
        "nightly",
        T0,
    )
    assert j["state"] == "scheduled"  # run_at = the run's time, still ahead
    row = sched(conn, "nightly")
    assert (row["next_run_at"], row["last_run_at"]) == (T0 + timedelta(days=1), T0)
    assert due(conn, T0 + timedelta(hours=1)) == []


def _upsert_defaults(conn: Conn) -> None:
    conn.execute(
        "SELECT pgjobs.upsert_schedule(name => 'd', kind => 'k', cron => '*/5 * * * *', next_run_at => %s)", (T0,)
    )
    row = sched(conn, "d")
    assert (row["timezone"], row["payload"], row["queue"], row["code_defined"]) == ("UTC", {}, "default", False)


def _due_schedules_unpaused_due_by_now_and_max_rows(conn: Conn) -> None:
    for i in range(5):
        upsert(conn, f"s{i}", next_run_at=T0 + i * MIN)
    upsert(conn, "future", next_run_at=T0 + timedelta(days=1))
    upsert(conn, "paused", next_run_at=T0 - MIN)
    assert scalar(conn, "SELECT pgjobs.pause_schedule(name => 'paused')") in (True, None)
    assert set(due(conn, T0 + 10 * MIN)) == {"s0", "s1", "s2", "s3", "s4"}
    assert due(conn, T0 + 2 * MIN) == ["s0", "s1", "s2"] or set(due(conn, T0 + 2 * MIN)) == {"s0", "s1", "s2"}
    assert len(due(conn, T0 + 10 * MIN, 2)) == 2
    assert due(conn, T0 + 10 * MIN, 0) == []
    conn.execute("SELECT pgjobs.resume_schedule(name => 'paused')")
    assert "paused" in due(conn, T0 + 10 * MIN)


def _due_schedules_reads_nothing_it_should_not_change(conn: Conn) -> None:
    upsert(conn, "r", next_run_at=T0)
    before = schedules(conn)
    due(conn, T0 + timedelta(days=30))
    assert schedules(conn) == before


# --- code-defined vs dynamic -----------------------------------------------------------------------------


def _a_dynamic_upsert_never_replaces_a_code_defined_schedule(conn: Conn) -> None:
    upsert(conn, "owned", kind="code-kind", code_defined=True)
    err = refused(
        conn,
        "PJ004",
        "SELECT pgjobs.upsert_schedule(name => 'owned', kind => 'dyn', cron => '0 * * * *', next_run_at => %s,"
        " code_defined => false)",
        (T0,),
    )
    assert "owned" in err
    refused(
        conn,
        "PJ004",
        "SELECT pgjobs.upsert_schedule(name => 'owned', kind => 'dyn', cron => '0 * * * *', next_run_at => %s)",
        (T0,),
    )
    assert sched(conn, "owned")["kind"] == "code-kind" and sched(conn, "owned")["code_defined"] is True
    refused(conn, "PJ004", "SELECT pgjobs.remove_schedule(name => 'owned')")
    # the application itself may update its code-defined schedule
    upsert(conn, "owned", kind="code-kind-2", code_defined=True)
    assert sched(conn, "owned")["kind"] == "code-kind-2"


def _prune_code_schedules_keeps_the_declared_and_every_dynamic_one(conn: Conn) -> None:
    for name in ("a", "b", "c"):
        upsert(conn, name, code_defined=True)
    upsert(conn, "dyn", code_defined=False)
    assert scalar(conn, "SELECT pgjobs.prune_code_schedules(keep => %s)", (["a", "zzz"],)) == 2
    assert [r["name"] for r in schedules(conn)] == ["a", "dyn"]
    assert scalar(conn, "SELECT pgjobs.prune_code_schedules(keep => %s::text[])", ([],)) == 1
    assert [r["name"] for r in schedules(conn)] == ["dyn"]


# --- pause / resume / remove -----------------------------------------------------------------------------


def _unknown_schedule_names_are_pj003(conn: Conn) -> None:
    upsert(conn, "known", next_run_at=T0 + timedelta(days=3650))
    for fn in ("pause_schedule", "resume_schedule", "remove_schedule"):
        refused(conn, "PJ003", f"SELECT pgjobs.{fn}(name => 'nope')")


def _pause_stops_materialisation_resume_restores_it_remove_deletes(conn: Conn) -> None:
    upsert(conn, "p", next_run_at=T0)
    conn.execute("SELECT pgjobs.pause_schedule(name => 'p')")
    assert due(conn, T0) == []
    assert materialize(conn, "p", T0, T0 + MIN) is None
    assert scalar(conn, "SELECT count(*) FROM pgjobs.jobs") == 0
    conn.execute("SELECT pgjobs.resume_schedule(name => 'p')")
    nxt = sched(conn, "p")["next_run_at"]
    assert due(conn, nxt) == ["p"]
    assert materialize(conn, "p", nxt, nxt + MIN) is not None
    assert scalar(conn, "SELECT pgjobs.remove_schedule(name => 'p')") in (True, None)
    assert "p" not in [r["name"] for r in schedules(conn)]
    assert scalar(conn, "SELECT count(*) FROM pgjobs.jobs") == 1  # the run it enqueued stays


# --- validation ------------------------------------------------------------------------------------------


BAD_UPSERTS: list[dict[str, Any]] = [
    {"name": ""},
    {"name": None},
    {"kind": ""},
    {"kind": None},
    {"cron": ""},
    {"cron": None},
    {"cron": "not a cron"},
    {"cron": "* * *"},
    {"cron": "every minute please now"},
    {"next_run_at": None},
    {"timezone": "Nowhere/Land"},
    {"timezone": None},
    {"queue": ""},
    {"payload": None},
]


def _upsert_bad_input_is_pj002_and_changes_nothing(conn: Conn) -> None:
    upsert(conn, "existing", kind="keep")
    for override in BAD_UPSERTS:
        for name in ("existing", "new"):
            args: dict[str, Any] = {"name": name, "kind": "k", "cron": "* * * * *", "next_run_at": T0} | override
            named = ", ".join(f"{k} => %({k})s" for k in args)
            refused(conn, "PJ002", f"SELECT pgjobs.upsert_schedule({named})", args)


OTHER_BAD_CALLS = [
    "SELECT * FROM pgjobs.due_schedules(now => NULL, max_rows => 10)",
    "SELECT * FROM pgjobs.due_schedules(now => now(), max_rows => -1)",
    "SELECT pgjobs.prune_code_schedules(keep => NULL)",
    "SELECT pgjobs.materialize_schedule(name => 's', expected_run_at => NULL, next_run_at => now())",
    "SELECT pgjobs.materialize_schedule(name => 's', expected_run_at => now(), next_run_at => NULL)",
    "SELECT pgjobs.materialize_schedule(name => '', expected_run_at => now(),"
    " next_run_at => now() + interval '1 minute')",
]


def _other_bad_input_is_pj002_and_changes_nothing(conn: Conn) -> None:
    upsert(conn, "s", code_defined=True)
    for query in OTHER_BAD_CALLS:
        refused(conn, "PJ002", query)


# --- materialize exactly once ----------------------------------------------------------------------------


def _materialize_exactly_once_losers_get_null(conn: Conn) -> None:
    upsert(conn, "once", next_run_at=T0)
    first = materialize(conn, "once", T0, T0 + MIN)
    assert first is not None
    assert materialize(conn, "once", T0, T0 + MIN) is None  # the same run again: a loser
    assert materialize(conn, "once", T0 + 5 * MIN, T0 + 6 * MIN) is None  # not the schedule's next run
    assert materialize(conn, "unknown", T0, T0 + MIN) is None
    assert scalar(conn, "SELECT count(*) FROM pgjobs.jobs WHERE schedule_name = 'once'") == 1
    second = materialize(conn, "once", T0 + MIN, T0 + 2 * MIN)
    assert second is not None and second != first


def _a_run_set_back_by_an_upsert_is_never_enqueued_twice(conn: Conn) -> None:
    upsert(conn, "back", next_run_at=T0)
    assert materialize(conn, "back", T0, T0 + MIN) is not None
    upsert(conn, "back", next_run_at=T0)  # someone sets the schedule back to a run already enqueued
    assert materialize(conn, "back", T0, T0 + MIN) is None
    assert scalar(conn, "SELECT count(*) FROM pgjobs.jobs WHERE schedule_name = 'back'") == 1
    assert sched(conn, "back")["next_run_at"] == T0 + MIN  # and the schedule still moves on


def test_a_scheduler_that_dies_between_due_and_materialize_loses_nothing(connect: Any) -> None:
    conn = connect()
    upsert(conn, "crash", next_run_at=T0)
    dying = connect(autocommit=False)
    assert due(dying, T0) == ["crash"]
    dying.execute(
        "SELECT pgjobs.materialize_schedule(name => 'crash', expected_run_at => %s, next_run_at => %s)", (T0, T0 + MIN)
    )
    dying.close()  # dies before commit
    assert due(conn, T0) == ["crash"]
    assert scalar(conn, "SELECT count(*) FROM pgjobs.jobs") == 0
    assert materialize(conn, "crash", T0, T0 + MIN) is not None
    assert scalar(conn, "SELECT count(*) FROM pgjobs.jobs") == 1


def test_racing_schedulers_materialize_each_run_exactly_once(connect: Any) -> None:
    setup = connect()
    names = [f"race{i}" for i in range(4)]
    for name in names:
        upsert(setup, name, next_run_at=T0)
    n_threads, ticks = 6, 5
    conns = [connect() for _ in range(n_threads)]
    won: list[list[tuple[str, int, int]]] = [[] for _ in range(n_threads)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(n_threads, timeout=30)

    def body(i: int) -> None:
        try:
            for tick in range(ticks):
                barrier.wait()
                run = T0 + tick * MIN
                for name in names if i % 2 else reversed(names):
                    job = materialize(conns[i], name, run, run + MIN)
                    if job is not None:
                        won[i].append((name, tick, job))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    wins = [w for ws in won for w in ws]
    assert sorted((n, t) for n, t, _ in wins) == sorted((n, t) for n in names for t in range(ticks))
    assert scalar(setup, "SELECT count(*) FROM pgjobs.jobs") == len(names) * ticks
    assert len({j for _, _, j in wins}) == len(wins)


# --- the tests (each runs its parts on one fresh database) -------------------------------------------


@pytest.mark.smoke
def test_upsert_named_arguments_defaults_due_and_materialize(conn: Conn) -> None:
    _upsert_with_every_named_argument_then_due_and_materialize(conn)
    _upsert_defaults(conn)


def test_due_schedules(conn: Conn) -> None:
    _due_schedules_unpaused_due_by_now_and_max_rows(conn)
    _due_schedules_reads_nothing_it_should_not_change(conn)


def test_code_defined_schedules_belong_to_the_application(conn: Conn) -> None:
    _prune_code_schedules_keeps_the_declared_and_every_dynamic_one(conn)
    _a_dynamic_upsert_never_replaces_a_code_defined_schedule(conn)


def test_pause_resume_remove(conn: Conn) -> None:
    _unknown_schedule_names_are_pj003(conn)
    _pause_stops_materialisation_resume_restores_it_remove_deletes(conn)


@pytest.mark.smoke
def test_bad_input_is_pj002_and_changes_nothing(conn: Conn) -> None:
    _upsert_bad_input_is_pj002_and_changes_nothing(conn)
    _other_bad_input_is_pj002_and_changes_nothing(conn)


def test_materialize_exactly_once(conn: Conn) -> None:
    _materialize_exactly_once_losers_get_null(conn)
    _a_run_set_back_by_an_upsert_is_never_enqueued_twice(conn)

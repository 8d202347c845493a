"""The role matrix: four NOLOGIN group roles, EXECUTE per role, no table privilege, PUBLIC nothing.

Every function of schema pgjobs is read from pg_proc and called as a LOGIN role that is a member of exactly
one group role (or of none), with NULL for every argument, in a transaction rolled back afterwards: a
refused call fails with 42501 before the function runs; any other outcome (a row, a PJ error) means the
role may call it. The expected matrix is written out here, independently of sql/roles.sql, and a public
function this file does not classify fails the test (a new function gets its role on purpose).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from tests.helpers.foundation import call, enqueue

GROUPS = ("pgjobs_producer", "pgjobs_worker", "pgjobs_reader", "pgjobs_admin")
PRODUCER = {
    "enqueue",
    "enqueue_many",
    "enqueue_staged",
    "enqueue_arrays",
    "job_status",
    "batch_status",
    "status_snapshot",
    "explain",
    # durable execution (sql/durable.sql)
    "signal",
    "durable_status",
}
WORKER = {
    "claim", "renew_lease", "renew_leases", "checkpoint", "progress", "complete", "complete_many", "fail",
    "dead_letter", "release", "ack_cancel", "add_to_batch", "parent_results", "parent_results_many",
    "worker_heartbeat", "reap_workers", "deregister_worker", "next_due_at", "next_due_within", "retry_backoff",
    "vacuum_due", "capped_queues",
    # a worker reports the jobs nobody takes in its queues (runtime/unhandled.py)
    "unhandled_kinds",
    # the scheduler runs inside workers
    "upsert_schedule", "prune_code_schedules", "due_schedules", "materialize_schedule", "materialize_schedules",
    "next_schedule_at",
    # durable execution (sql/durable.sql)
    "record_step", "job_steps", "sleep_until", "await_signal",
    # whether rate limits hold back the served queues (runtime/listener.py)
    "list_rate_limits",
}  # fmt: skip
READER = {
    "job_status", "batch_status", "status_snapshot", "explain", "batch_graph", "stats", "list_jobs", "list_workers",
    "list_queues", "count_jobs", "list_schedules", "get_schedule", "read_events", "stream_bounds", "stream_head",
    "unhandled_kinds",
    # the dashboard's reads (sql/dashboard.sql)
    "dashboard_jobs", "dashboard_count_jobs", "dashboard_queues", "dashboard_throughput", "dashboard_groups",
    "dashboard_workers", "dashboard_state_counts", "durable_status",
    # rate limits (sql/rate_limits.sql)
    "list_rate_limits",
    # fair queues' rings (sql/fair.sql)
    "fair_ring_groups",
}  # fmt: skip
ADMIN_ONLY = {
    "cancel", "cancel_batch", "retry", "delete", "delete_batch", "purge", "configure_queue", "pause_schedule",
    "resume_schedule", "remove_schedule", "configure_stream", "maintain", "maintain_history",
    # the dashboard's actions (sql/dashboard.sql)
    "dashboard_bulk", "trigger_schedule", "purge_signals",
    # rate limits (sql/rate_limits.sql)
    "configure_rate_limit",
    # fair queues' group weights (sql/admin.sql)
    "configure_group",
}  # fmt: skip
ALLOWED = {"pgjobs_producer": PRODUCER, "pgjobs_worker": WORKER, "pgjobs_reader": READER}
KNOWN = PRODUCER | WORKER | READER | ADMIN_ONLY

Conn = psycopg.Connection[Any]


@pytest.fixture
def logins(dsn: str, pg_server_dsn: str) -> Iterator[dict[str, str]]:
    """One LOGIN role per group role (member of that group only), plus one member of none: name -> DSN."""
    token = secrets.token_hex(4)
    made: dict[str, str] = {}
    with psycopg.connect(pg_server_dsn, autocommit=True) as admin:
        try:
            for group in (*GROUPS, None):
                name = f"pjt_{token}_{(group or 'pgjobs_nobody').removeprefix('pgjobs_')}"
                admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
                made[group or "nobody"] = name
                if group:
                    admin.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(group), sql.Identifier(name)))
            yield {k: make_conninfo(dsn, user=v) for k, v in made.items()}
        finally:
            dbname = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
            with psycopg.connect(dsn, autocommit=True) as db:
                db.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = ANY(%s) AND datname = %s",
                    (list(made.values()), dbname),
                )
            for name in made.values():
                with psycopg.connect(dsn, autocommit=True) as db:
                    db.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
                admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def routines(conn: Conn) -> list[tuple[str, str, list[str]]]:
    """(name, regprocedure, argument types) of every function of schema pgjobs."""
    rows = conn.execute(
        "SELECT p.proname::text, p.oid::regprocedure::text,"
        " array(SELECT format_type(t, NULL) FROM unnest(p.proargtypes) AS t)"
        " FROM pg_proc AS p WHERE p.pronamespace = 'pgjobs'::regnamespace ORDER BY 2"
    ).fetchall()
    return [(r[0], r[1], list(r[2])) for r in rows]


def sqlstate_of(conn: Conn, name: str, types: list[str]) -> str | None:
    """Calls pgjobs.<name>(NULL::t1, ...) in a rolled-back transaction; the SQLSTATE it raised, or None."""
    args = sql.SQL(", ").join(sql.SQL("NULL::{}").format(sql.SQL(t)) for t in types)
    query = sql.SQL("SELECT pgjobs.{}({})").format(sql.Identifier(name), args)
    try:
        with conn.transaction(force_rollback=True):
            conn.execute("SET LOCAL statement_timeout = '5s'")
            conn.execute(query).fetchall()
    except psycopg.Error as exc:
        return exc.sqlstate
    return None


def test_every_public_function_is_classified(conn: Conn) -> None:
    public = {name for name, _sig, _types in routines(conn) if not name.startswith("_")}
    assert public - KNOWN == set(), "classify these functions in sql/roles.sql and in this test"


def test_public_functions_are_security_definer_with_a_pinned_path_and_no_public_execute(conn: Conn) -> None:
    rows = conn.execute(
        "SELECT p.oid::regprocedure::text, p.proname LIKE '\\_%' AS internal, p.prosecdef, p.proconfig,"
        " p.proowner = n.nspowner AS owned, has_function_privilege('public', p.oid, 'EXECUTE') IS TRUE AS pub,"
        " coalesce((SELECT bool_or(a.grantee = 0) FROM aclexplode(p.proacl) AS a), false) AS public_acl"
        " FROM pg_proc AS p JOIN pg_namespace AS n ON n.oid = p.pronamespace WHERE n.nspname = 'pgjobs'"
    ).fetchall()
    assert rows
    for sig, internal, secdef, config, owned, _pub, public_acl in rows:
        assert "search_path=pg_catalog, pgjobs, pg_temp" in (config or []), sig
        assert owned, sig
        assert not public_acl, f"PUBLIC may execute {sig}"
        assert secdef is not internal, sig  # public ones definer, internal ones not


def test_each_role_may_call_exactly_its_functions(conn: Conn, logins: dict[str, str]) -> None:
    funcs = routines(conn)
    for who, login_dsn in logins.items():
        with psycopg.connect(login_dsn) as as_role:
            assert as_role.execute("SELECT current_user").fetchone() != ("postgres",)
            member_of = as_role.execute(
                "SELECT array(SELECT b.rolname::text FROM pg_auth_members AS m JOIN pg_roles AS b ON b.oid = m.roleid"
                " WHERE m.member = (SELECT oid FROM pg_roles WHERE rolname = current_user))"
            ).fetchone()
            assert member_of == ([who] if who != "nobody" else [],)
            wrong: list[str] = []
            for name, sig, types in funcs:
                internal = name.startswith("_")
                if internal or who == "nobody":
                    allowed = False
                elif who == "pgjobs_admin":
                    allowed = True
                else:
                    allowed = name in ALLOWED[who]
                state = sqlstate_of(as_role, name, types)
                if allowed == (state == "42501"):
                    wrong.append(f"{sig}: {'refused' if allowed else 'allowed'} ({state})")
            assert wrong == [], f"as {who}"


def test_no_role_holds_a_table_privilege(conn: Conn, logins: dict[str, str]) -> None:
    rows = conn.execute(
        "SELECT r.rolname::text, c.oid::regclass::text FROM pg_class AS c CROSS JOIN pg_roles AS r"
        " WHERE c.relnamespace = 'pgjobs'::regnamespace AND c.relkind IN ('r', 'S', 'v', 'm', 'p')"
        " AND r.rolname = ANY(%s)"
        " AND (has_table_privilege(r.oid, c.oid, 'SELECT,INSERT,UPDATE,DELETE,TRUNCATE,REFERENCES,TRIGGER')"
        "      OR (c.relkind = 'S' AND has_sequence_privilege(r.oid, c.oid, 'USAGE,SELECT,UPDATE')))",
        (list(GROUPS),),
    ).fetchall()
    assert rows == []
    for who, login_dsn in logins.items():
        with psycopg.connect(login_dsn, autocommit=True) as as_role:
            for table in ("jobs", "sql_revision", "queues"):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    as_role.execute(sql.SQL("SELECT 1 FROM pgjobs.{}").format(sql.Identifier(table)))
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                as_role.execute("UPDATE pgjobs.sql_revision SET digest = 'x'")
            assert who  # every role was tried


def test_the_roles_do_the_work_through_the_functions_only(conn: Conn, logins: dict[str, str]) -> None:
    """SECURITY DEFINER end to end: a producer enqueues, a worker claims and completes, a reader reads,
    an admin purges, none of them with a single table privilege."""
    with (
        psycopg.connect(logins["pgjobs_producer"], autocommit=True) as producer,
        psycopg.connect(logins["pgjobs_worker"], autocommit=True) as worker,
        psycopg.connect(logins["pgjobs_reader"], autocommit=True) as reader,
        psycopg.connect(logins["pgjobs_admin"], autocommit=True) as admin,
    ):
        jid = enqueue(producer, "roles", payload={"a": 1})["id"]
        (job,) = call(worker, "claim", worker="w1")
        assert job["id"] == jid
        assert call(worker, "complete", id=jid, lease_token=job["lease_token"], result={"ok": True})[0]["complete"]
        assert call(producer, "job_status", id=jid)[0]["state"] == "succeeded"
        assert {(r["queue"], r["state"], r["jobs"]) for r in call(reader, "stats")} == {("default", "succeeded", 1)}
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            call(producer, "cancel", id=jid)
        assert call(admin, "purge", succeeded_before=0, failed_before=0)[0]["purge"] == 1
        call(admin, "configure_queue", queue="q", paused=True)
        assert [(r["queue"], r["paused"]) for r in call(reader, "list_queues")] == [("q", True)]
    assert conn.execute("SELECT count(*) FROM pgjobs.jobs").fetchone() == (0,)


def test_a_temp_table_no_longer_shadows_a_pgjobs_table(conn: Conn, logins: dict[str, str]) -> None:
    enqueue(conn, "real")
    with psycopg.connect(logins["pgjobs_reader"], autocommit=True) as reader:
        reader.execute("CREATE TEMP TABLE jobs (queue text, state pgjobs.job_state, kind text)")
        reader.execute("INSERT INTO jobs SELECT 'fake', 'pending', 'fake' FROM generate_series(1, 5)")
        reader.execute("CREATE TEMP TABLE queues (queue text, paused boolean)")
        assert {(r["queue"], r["jobs"]) for r in call(reader, "stats")} == {("default", 1)}
    with psycopg.connect(logins["pgjobs_admin"], autocommit=True) as admin:
        admin.execute("CREATE TEMP TABLE queues (queue text PRIMARY KEY, max_length int, paused boolean)")
        call(admin, "configure_queue", queue="default", paused=True)
        assert admin.execute("SELECT count(*) FROM pg_temp.queues").fetchone() == (0,)
    assert conn.execute("SELECT paused FROM pgjobs.queues WHERE queue = 'default'").fetchone() == (True,)


def test_rate_limits_are_configured_by_admins_and_named_by_producers(conn: Conn, logins: dict[str, str]) -> None:
    """configure_rate_limit and configure_queue's limit are pgjobs_admin's; a producer names a key on enqueue; a
    worker claims under the limit (the tokens are taken inside claim, with no table privilege of its own)."""
    with (
        psycopg.connect(logins["pgjobs_producer"], autocommit=True) as producer,
        psycopg.connect(logins["pgjobs_worker"], autocommit=True) as worker,
        psycopg.connect(logins["pgjobs_admin"], autocommit=True) as admin,
    ):
        for who in (producer, worker):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                who.execute("SELECT pgjobs.configure_rate_limit('k', 1, '1 hour')")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                who.execute("SELECT pgjobs.configure_queue('q', max_starts => 1, per => '1 hour')")
        admin.execute("SELECT pgjobs.configure_rate_limit('k', 1, '1 hour')")
        ids = [enqueue(producer, "roles", rate_key="k")["id"] for _ in range(2)]
        assert [j["id"] for j in call(worker, "claim", worker="w1", max_jobs=2)] == ids[:1]
        assert call(worker, "list_rate_limits")[0]["tokens"] == 0
    assert conn.execute("SELECT count(*) FROM pgjobs.jobs WHERE rate_held_until IS NOT NULL").fetchone() == (1,)

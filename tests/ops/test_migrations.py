"""Migrations: deploy -> revert -> deploy round trip, verify scripts, idempotence, concurrent migrators.

The schema is compared as a catalog dump of everything in schema pgjobs (tables, columns, defaults,
constraints, indexes, types, enum labels, sequences, triggers, routines with their full definitions), with
no OIDs in it, so two databases migrated separately compare equal exactly when their schemas are the same.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

import pgjobs
from pgjobs.ops import migrate as m

CATALOG_QUERIES = {
    "tables": """
        SELECT c.relname, c.relkind::text, c.relpersistence::text, coalesce(c.reloptions::text, ''),
               coalesce((SELECT i.inhparent::regclass::text FROM pg_inherits AS i WHERE i.inhrelid = c.oid), ''),
               coalesce(pg_get_expr(c.relpartbound, c.oid), ''),
               CASE WHEN c.relkind = 'p' THEN pg_get_partkeydef(c.oid) ELSE '' END
          FROM pg_class AS c
         WHERE c.relnamespace = 'pgjobs'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'S')
         ORDER BY 1""",
    "columns": """
        SELECT c.relname,
               -- the column's place among the live ones: a column dropped by a revert and added again by a
               -- deploy keeps its place though it takes a new attnum
               row_number() OVER (PARTITION BY c.oid ORDER BY a.attnum), a.attname,
               format_type(a.atttypid, a.atttypmod), a.attnotnull,
               coalesce(pg_get_expr(d.adbin, d.adrelid), ''), a.attidentity::text,
               a.attcompression::text
          FROM pg_attribute AS a
          JOIN pg_class AS c ON c.oid = a.attrelid
          LEFT JOIN pg_attrdef AS d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
         WHERE c.relnamespace = 'pgjobs'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'c')
           AND a.attnum > 0 AND NOT a.attisdropped
         ORDER BY 1, 2""",
    "constraints": """
        SELECT t.relname, k.conname, pg_get_constraintdef(k.oid)
          FROM pg_constraint AS k JOIN pg_class AS t ON t.oid = k.conrelid
         WHERE k.connamespace = 'pgjobs'::regnamespace
         ORDER BY 1, 2""",
    "sequences": """
        SELECT s.sequencename, s.data_type::text, s.start_value, s.min_value, s.max_value, s.increment_by, s.cycle,
               s.cache_size
          FROM pg_sequences AS s WHERE s.schemaname = 'pgjobs'
         ORDER BY 1""",
    "indexes": """
        SELECT i.indexname, i.indexdef FROM pg_indexes AS i WHERE i.schemaname = 'pgjobs' ORDER BY 1""",
    "types": """
        SELECT t.typname, t.typtype::text,
               coalesce((SELECT string_agg(e.enumlabel, ',' ORDER BY e.enumsortorder)
                           FROM pg_enum AS e WHERE e.enumtypid = t.oid), '')
          FROM pg_type AS t
         WHERE t.typnamespace = 'pgjobs'::regnamespace AND t.typtype IN ('e', 'c', 'd')
           AND (t.typtype <> 'c' OR (SELECT c.relkind FROM pg_class AS c WHERE c.oid = t.typrelid) = 'c')
         ORDER BY 1""",
    "triggers": """
        SELECT c.relname, g.tgname, pg_get_triggerdef(g.oid)
          FROM pg_trigger AS g JOIN pg_class AS c ON c.oid = g.tgrelid
         WHERE c.relnamespace = 'pgjobs'::regnamespace AND NOT g.tgisinternal
         ORDER BY 1, 2""",
    "routines": """
        SELECT p.oid::regprocedure::text, p.prokind::text, coalesce(p.proconfig::text, ''),
               CASE WHEN p.prokind = 'a' THEN '' ELSE pg_get_functiondef(p.oid) END
          FROM pg_proc AS p
         WHERE p.pronamespace = 'pgjobs'::regnamespace
         ORDER BY 1""",
}


def catalog(dsn: str) -> dict[str, list[tuple[Any, ...]]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return {name: [tuple(r) for r in conn.execute(q).fetchall()] for name, q in CATALOG_QUERIES.items()}


def routine_oids(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT p.oid::regprocedure::text, p.oid::bigint FROM pg_proc AS p"
            " WHERE p.pronamespace = 'pgjobs'::regnamespace"
        ).fetchall()
    return {r[0]: r[1] for r in rows}


def has_schema(dsn: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = 'pgjobs'").fetchone() is not None


PLAN = [c.name for c in m.plan()]


@pytest.mark.smoke
def test_migrate_a_blank_database_then_verify(blank_dsn: str, dsn: str) -> None:
    result = m.migrate(blank_dsn)
    assert result.applied == PLAN and result.functions_installed is True
    assert m.verify(blank_dsn) == PLAN
    assert m.status(blank_dsn) == dict.fromkeys(PLAN, True)
    # the same schema as the test template (migrated by the harness through the same function)
    assert catalog(blank_dsn) == catalog(dsn)
    dump = catalog(blank_dsn)
    assert len(dump["routines"]) >= 20 and any(r[0].startswith("pgjobs.enqueue(") for r in dump["routines"])


@pytest.mark.smoke
def test_a_second_migrate_changes_nothing(dsn: str) -> None:
    before, oids = catalog(dsn), routine_oids(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        revision = conn.execute("SELECT xmin::text, digest FROM pgjobs.sql_revision").fetchone()
    result = m.migrate(dsn)
    assert result.applied == [] and result.functions_installed is False
    assert catalog(dsn) == before
    assert routine_oids(dsn) == oids  # not even re-created
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT xmin::text, digest FROM pgjobs.sql_revision").fetchone() == revision


def test_deploy_revert_deploy_round_trip(blank_dsn: str) -> None:
    m.migrate(blank_dsn)
    first = catalog(blank_dsn)
    reverted = m.rollback(blank_dsn)
    assert reverted == PLAN[::-1]
    assert not has_schema(blank_dsn)
    assert m.status(blank_dsn) == dict.fromkeys(PLAN, False)
    assert m.verify(blank_dsn) == []  # nothing deployed, nothing to verify
    again = m.migrate(blank_dsn)
    assert again.applied == PLAN and again.functions_installed is True
    assert m.verify(blank_dsn) == PLAN
    assert catalog(blank_dsn) == first
    # and the round-tripped schema works
    with psycopg.connect(blank_dsn, autocommit=True) as conn:
        jid = conn.execute("SELECT id FROM pgjobs.enqueue(kind => 'after_round_trip')").fetchone()
        claimed = conn.execute("SELECT id FROM pgjobs.claim(worker => 'w')").fetchone()
        assert jid is not None and claimed == jid


@pytest.mark.skipif(len(PLAN) < 2, reason="the plan has a single change")
def test_partial_revert_to_the_first_change_and_back(blank_dsn: str) -> None:
    m.migrate(blank_dsn)
    first = catalog(blank_dsn)
    assert m.rollback(blank_dsn, to=PLAN[0]) == PLAN[:0:-1]
    assert m.status(blank_dsn) == {name: name == PLAN[0] for name in PLAN}
    assert m.verify(blank_dsn) == [PLAN[0]]
    assert m.migrate(blank_dsn).applied == PLAN[1:]
    assert catalog(blank_dsn) == first
    with pytest.raises(ValueError, match="no_such_change"):
        m.rollback(blank_dsn, to="no_such_change")


def test_verify_fails_when_an_object_is_missing(dsn: str) -> None:
    assert m.verify(dsn) == PLAN
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE pgjobs.workers CASCADE")
    with pytest.raises(psycopg.Error):
        m.verify(dsn)


def test_changed_functions_are_reinstalled_and_the_data_stays(dsn: str) -> None:
    before = catalog(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        jid = conn.execute("SELECT id FROM pgjobs.enqueue(kind => 'kept')").fetchone()
        conn.execute("UPDATE pgjobs.sql_revision SET digest = 'an older revision'")
        # a routine left over from an older revision (say, a renamed helper) does not survive the reinstall
        conn.execute("CREATE FUNCTION pgjobs._stale_helper() RETURNS int LANGUAGE sql AS 'SELECT 1'")
    result = m.migrate(dsn)
    assert result.applied == [] and result.functions_installed is True
    assert catalog(dsn) == before
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT id FROM pgjobs.jobs WHERE kind = 'kept'").fetchone() == jid
        assert conn.execute("SELECT digest FROM pgjobs.sql_revision").fetchone() == (m.sql_digest(),)


def test_an_internal_routine_the_files_no_longer_define_outlives_a_call_running_its_caller_s_old_body(
    dsn: str,
) -> None:
    """A call inside an old body when the new functions commit still reaches the internal routines that body
    calls, which the new files no longer define: they are dropped once the calls running at the commit have
    ended, not with the install (an old worker's claim waiting on a lock runs its old body after the wait)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE FUNCTION pgjobs._stale_inner() RETURNS int LANGUAGE sql AS 'SELECT 1'")
        conn.execute(
            "CREATE FUNCTION pgjobs._stale_outer() RETURNS int LANGUAGE plpgsql"
            " AS $$ BEGIN PERFORM pg_sleep(2); RETURN pgjobs._stale_inner(); END $$"
        )
        conn.execute("UPDATE pgjobs.sql_revision SET digest = 'an older revision'")
        got: list[Any] = []

        def call() -> None:
            with psycopg.connect(dsn, autocommit=True) as c:
                got.append(c.execute("SELECT pgjobs._stale_outer()").fetchone())

        caller = threading.Thread(target=call)
        caller.start()
        deadline = time.monotonic() + 10
        while not conn.execute(
            "SELECT count(*) > 0 FROM pg_stat_activity WHERE query LIKE 'SELECT pgjobs._stale_outer()%%'"
            " AND state = 'active'"
        ).fetchone()[0]:  # type: ignore[index]
            assert time.monotonic() < deadline, "the call did not start"
            time.sleep(0.01)
        assert m.migrate(dsn).functions_installed is True
        caller.join(30)
        assert got == [(1,)]
        assert conn.execute(
            "SELECT count(*) FROM pg_proc WHERE pronamespace = 'pgjobs'::regnamespace AND proname LIKE '_stale%%'"
        ).fetchone() == (0,)


def test_an_internal_routine_the_files_no_longer_define_outlives_a_transaction_begun_before_the_install(
    dsn: str,
) -> None:
    """A transaction begun before the new functions commit, idle at that moment, runs the old bodies in its
    later statements (a call takes no lock before it looks up its function): the internal routines they call
    are dropped only once that transaction has ended."""
    with psycopg.connect(dsn, autocommit=True) as conn, psycopg.connect(dsn) as held:
        conn.execute("CREATE FUNCTION pgjobs._stale_inner() RETURNS int LANGUAGE sql AS 'SELECT 1'")
        conn.execute(
            "CREATE FUNCTION pgjobs._stale_outer() RETURNS int LANGUAGE plpgsql"
            " AS $$ BEGIN RETURN pgjobs._stale_inner(); END $$"
        )
        conn.execute("UPDATE pgjobs.sql_revision SET digest = 'an older revision'")
        held.execute("SELECT 1")  # its transaction begins before the install
        done: list[bool] = []
        migrating = threading.Thread(target=lambda: done.append(m.migrate(dsn).functions_installed))
        migrating.start()
        deadline = time.monotonic() + 20
        while conn.execute("SELECT digest FROM pgjobs.sql_revision").fetchone() == ("an older revision",):
            assert time.monotonic() < deadline, "the install did not commit"
            time.sleep(0.01)
        assert held.execute("SELECT pgjobs._stale_outer()").fetchone() == (1,)
        held.commit()
        migrating.join(60)
        assert done == [True]
        assert conn.execute(
            "SELECT count(*) FROM pg_proc WHERE pronamespace = 'pgjobs'::regnamespace AND proname LIKE '_stale%%'"
        ).fetchone() == (0,)


def test_a_routine_whose_result_type_changed_is_reinstalled_by_drop_and_create(dsn: str) -> None:
    """CREATE OR REPLACE refuses a new result type (42P13): install then drops everything and creates it
    all, so an installed revision whose routine returned something else still upgrades to the same catalog."""
    before = catalog(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP FUNCTION pgjobs._stream_lock()")
        conn.execute("CREATE FUNCTION pgjobs._stream_lock() RETURNS int LANGUAGE sql AS 'SELECT 1'")
        conn.execute("UPDATE pgjobs.sql_revision SET digest = 'an older revision'")
    assert m.migrate(dsn).functions_installed is True
    assert catalog(dsn) == before


def _migrate_in_a_process(dsn: str, start_at: float) -> subprocess.Popen[str]:
    code = (
        "import sys, time\n"
        "from pgjobs.ops.migrate import migrate\n"
        f"time.sleep(max(0.0, {start_at!r} - time.time()))\n"
        "r = migrate(sys.argv[1])\n"
        "print(len(r.applied), r.functions_installed)\n"
    )
    root = Path(pgjobs.__file__).resolve().parent.parent
    return subprocess.Popen(
        [sys.executable, "-c", code, dsn], cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


@pytest.mark.smoke
def test_two_processes_migrating_a_fresh_database_at_once(blank_dsn: str, dsn: str) -> None:
    start_at = time.time() + 2.0  # both import first, then start together
    procs = [_migrate_in_a_process(blank_dsn, start_at) for _ in range(2)]
    outputs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        outputs.append(out.split())
    # exactly one of them did the work; the other found it done
    assert sorted(outputs) == sorted([[str(len(PLAN)), "True"], ["0", "False"]])
    assert m.verify(blank_dsn) == PLAN
    assert catalog(blank_dsn) == catalog(dsn)


def test_threads_migrating_a_fresh_database_at_once(blank_dsn: str, dsn: str) -> None:
    barrier = threading.Barrier(4)
    results: list[m.MigrateResult] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            barrier.wait(30)
            results.append(m.migrate(blank_dsn))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    assert sorted(len(r.applied) for r in results) == [0, 0, 0, len(PLAN)]
    assert sum(r.functions_installed for r in results) == 1
    assert catalog(blank_dsn) == catalog(dsn)


def test_a_broken_function_body_fails_the_install_and_leaves_the_old_functions(
    dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bodies are installed unchecked (cross-file calls) and then validated in the same transaction."""
    oids, before = routine_oids(dsn), catalog(dsn)
    broken = tmp_path / "sql"
    broken.mkdir()
    for f in m.sql_files():
        (broken / f.name).write_text(f.read_text())
    (broken / "zz_broken.sql").write_text(
        "CREATE FUNCTION pgjobs.broken() RETURNS int LANGUAGE plpgsql SET search_path = pg_catalog, pgjobs, pg_temp"
        " AS $$ BEGIN SELCT 1; RETURN 1; END $$;"
    )
    monkeypatch.setattr(m, "SQL_DIR", broken)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET search_path = public")
        with pytest.raises(psycopg.errors.SyntaxError, match="SELCT"):
            m.install_functions(conn)
        assert conn.execute("SHOW search_path").fetchone() == ("public",)  # the session's own setting is back
    assert routine_oids(dsn) == oids and catalog(dsn) == before
    monkeypatch.undo()
    assert m.migrate(dsn).functions_installed is False


def test_a_database_migrated_by_a_pre_release_plan_is_refused_in_one_line(blank_dsn: str) -> None:
    """A database whose bookkeeping names changes this plan does not have (a plan from before the first
    release, squashed since) is refused before anything runs, rollback included (and status and verify say
    so too): no change of this plan starts from its schema."""
    m.migrate(blank_dsn)
    before = catalog(blank_dsn)
    with psycopg.connect(blank_dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO pgjobs_migrations._yoyo_migration (migration_hash, migration_id, applied_at_utc)"
            " VALUES ('h1', 'an_old_change', now()), ('h2', 'another_old_change', now())"
        )
    for run in (m.migrate, m.rollback, m.status, m.verify):
        with pytest.raises(m.PreReleaseDatabase) as refused:
            run(blank_dsn)
        message = str(refused.value)
        assert "\n" not in message and "pre-release plan" in message and "recreate it" in message
        assert "an_old_change, another_old_change" in message
    assert catalog(blank_dsn) == before
    # the CLI says the same, in one line, and exits non-zero
    root = Path(pgjobs.__file__).resolve().parent.parent
    for mode in ([], ["--status"]):
        done = subprocess.run(
            [sys.executable, "-m", "pgjobs", "migrate", "--dsn", blank_dsn, *mode],
            cwd=root, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode != 0
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and "pre-release plan" in lines[0], done.stderr


def test_functions_reinstalled_while_workers_call_them_fail_no_call(dsn: str) -> None:
    """A function swap commits while producers and workers are inside pgjobs' functions: the routines are
    replaced in place (same oids), so no call fails. Dropping them all first, as install did before, made
    calls in flight fail with "cache lookup failed for function" (XX000) or deadlock with the drop."""
    stop = threading.Event()
    errors: list[str] = []
    done: list[int] = []

    def work() -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            while not stop.is_set():
                try:
                    c.execute("SELECT * FROM pgjobs.enqueue(kind => 'swap')")
                    rows = c.execute("SELECT id, lease_token FROM pgjobs.claim('w', '{default}', 5)").fetchall()
                    if rows:
                        c.execute(
                            "SELECT pgjobs.complete_many(%s::bigint[], %s::uuid[])",
                            [[r[0] for r in rows], [r[1] for r in rows]],
                        )
                        done.extend(r[0] for r in rows)
                except psycopg.Error as exc:
                    errors.append(f"{exc.sqlstate}: {exc}")

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for _ in range(6):
                assert m.install_functions(conn, force=True)
                time.sleep(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert errors == []
    assert done

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
        SELECT c.relname, c.relkind::text, coalesce(c.reloptions::text, '')
          FROM pg_class AS c
         WHERE c.relnamespace = 'pgjobs'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'S')
         ORDER BY 1""",
    "columns": """
        SELECT c.relname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
               coalesce(pg_get_expr(d.adbin, d.adrelid), ''), a.attidentity::text
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


def test_lean_jobs_flags_parents_that_existing_edges_point_at(blank_dsn: str) -> None:
    """Before lean_jobs, batch members created with their children were left without has_dependents
    (and _propagate looked at every member); since, _propagate reads only flagged parents, so the
    migration must flag every job an edge points at, or its children would never be released."""
    m.migrate(blank_dsn)
    m.rollback(blank_dsn, to="fairness")
    with psycopg.connect(blank_dsn, autocommit=True) as conn:
        parent, _lone = (
            conn.execute("INSERT INTO pgjobs.jobs (kind) VALUES ('parent') RETURNING id").fetchone()[0],
            conn.execute("INSERT INTO pgjobs.jobs (kind) VALUES ('lone') RETURNING id").fetchone()[0],
        )
        child = conn.execute(
            "INSERT INTO pgjobs.jobs (kind, state, remaining_deps) VALUES ('child', 'waiting', 1) RETURNING id"
        ).fetchone()[0]
        conn.execute("INSERT INTO pgjobs.edges (child_id, parent_job_id) VALUES (%s, %s)", (child, parent))
    assert m.migrate(blank_dsn).applied == PLAN[PLAN.index("fairness") + 1 :]
    with psycopg.connect(blank_dsn, autocommit=True) as conn:
        flags = dict(conn.execute("SELECT kind, has_dependents FROM pgjobs.jobs").fetchall())
        assert flags == {"parent": True, "lone": False, "child": False}
        # and the parent, settled by the new functions, releases its child
        claimed = conn.execute("SELECT id, lease_token FROM pgjobs.claim('w', '{default}', 2)").fetchall()
        for job_id, token in claimed:
            assert conn.execute("SELECT pgjobs.complete(id => %s, lease_token => %s)", (job_id, token)).fetchone()[0]
        assert conn.execute("SELECT state::text FROM pgjobs.jobs WHERE id = %s", (child,)).fetchone()[0] == "pending"


def test_event_log_upgrades_in_place_under_load(blank_dsn: str) -> None:
    """event_log deployed while claimers and completers keep running: no job lost, none run twice, and the
    stream holds the events of every transition after the upgrade."""
    m.migrate(blank_dsn)
    m.rollback(blank_dsn, to="lean_jobs")
    with psycopg.connect(blank_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO pgjobs.jobs (kind) SELECT 'k' FROM generate_series(1, 3000)")
    stop = threading.Event()
    done: list[int] = []
    errors: list[str] = []
    unexpected: list[str] = []

    def work() -> None:
        with psycopg.connect(blank_dsn, autocommit=True) as c:
            while not stop.is_set():
                try:
                    rows = c.execute("SELECT id, lease_token FROM pgjobs.claim('w', '{default}', 20)").fetchall()
                    if rows:
                        n = c.execute(
                            "SELECT pgjobs.complete_many(%s::bigint[], %s::uuid[])",
                            [[r[0] for r in rows], [r[1] for r in rows]],
                        ).fetchone()
                        assert n is not None and n[0] == len(rows)
                        done.extend(r[0] for r in rows)
                except psycopg.errors.UndefinedTable as exc:  # the functions are newer than the tables, until then
                    errors.append(str(exc))
                    time.sleep(0.01)
                except psycopg.Error as exc:  # anything else is a failed call: recorded, not a silently dead thread
                    unexpected.append(f"{exc.sqlstate}: {exc}")

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    plan = [c.name for c in m.plan()]
    # event_log and the changes planned after it
    assert m.migrate(blank_dsn).applied == plan[plan.index("event_log") :]
    deadline = time.monotonic() + 60
    while len(done) < 3000 and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    for t in threads:
        t.join(30)
    assert unexpected == []
    assert sorted(done) == list(range(1, 3001))  # every job once
    with psycopg.connect(blank_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT count(*), max(attempt) FROM pgjobs.jobs WHERE state = 'succeeded'").fetchone() == (
            3000,
            1,
        )
        logged = conn.execute("SELECT count(*) FROM pgjobs.read_events(max_rows => 100000)").fetchone()
        assert logged is not None and logged[0] > 0


def test_job_history_upgrades_a_database_with_jobs_in_every_state(blank_dsn: str) -> None:
    """job_history converts an installed jobs table in place: every job keeps its row and state, the finished
    ones move to history, the unique keys move to job_keys (a key still blocks after the upgrade, a
    unique_live_only key of a finished job does not), edges survive, and ids continue."""
    m.migrate(blank_dsn)
    m.rollback(blank_dsn, to=PLAN[PLAN.index("job_history") - 1])  # the revision before job_history
    states = ["waiting", "scheduled", "pending", "active", "succeeded", "failed", "cancelled"]
    with psycopg.connect(blank_dsn, autocommit=True) as conn:
        for s in states:
            conn.execute(
                "INSERT INTO pgjobs.jobs (kind, state, lease_token, completed_at, run_at, unique_key, unique_live_only)"
                " SELECT 'k', %s::pgjobs.job_state, CASE WHEN %s = 'active' THEN gen_random_uuid() END,"
                "        CASE WHEN %s IN ('succeeded', 'failed', 'cancelled') THEN now() - n * interval '1 day' END,"
                "        now() + CASE WHEN %s = 'scheduled' THEN interval '1 hour' ELSE interval '0' END,"
                "        CASE WHEN n = 1 THEN %s || '-key' WHEN n = 2 THEN %s || '-live' END, n = 2"
                "   FROM generate_series(1, 5) AS n",
                (s, s, s, s, s, s),
            )
        parent, child = (
            conn.execute("SELECT min(id) FROM pgjobs.jobs WHERE state = %s", (s,)).fetchone()[0]  # type: ignore[index]
            for s in ("succeeded", "waiting")
        )
        conn.execute("UPDATE pgjobs.jobs SET has_dependents = true WHERE id = %s", (parent,))
        conn.execute(
            "INSERT INTO pgjobs.edges (child_id, parent_job_id, satisfied) VALUES (%s, %s, true)", (child, parent)
        )
        before = conn.execute("SELECT id, state::text, unique_key FROM pgjobs.jobs ORDER BY id").fetchall()
    assert m.migrate(blank_dsn).applied == PLAN[PLAN.index("job_history") :]  # job_history and the changes after it
    assert m.verify(blank_dsn) == PLAN
    with psycopg.connect(blank_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT id, state::text, unique_key FROM pgjobs.jobs ORDER BY id").fetchall() == before
        where = dict(
            conn.execute(
                "SELECT state::text, string_agg(DISTINCT tableoid::regclass::text, ',') FROM pgjobs.jobs GROUP BY 1"
            ).fetchall()
        )
        assert {s: where[s] for s in states[:4]} == dict.fromkeys(states[:4], "pgjobs.jobs_live")
        assert all(where[s].startswith(("pgjobs.jobs_succeeded_", "pgjobs.jobs_failed_")) for s in states[4:])
        # every key that blocked before blocks now; a live-only key of a finished job was given back
        keys = {r[0] for r in conn.execute("SELECT unique_key FROM pgjobs.job_keys").fetchall()}
        assert keys == {f"{s}-key" for s in states} | {f"{s}-live" for s in states[:4]}
        for s in states:
            row = conn.execute("SELECT created FROM pgjobs.enqueue('k', unique_key => %s)", (f"{s}-key",)).fetchone()
            assert row == (False,)
        for s in states[4:]:
            assert conn.execute(
                "SELECT created FROM pgjobs.enqueue('k', unique_key => %s, unique_live_only => true)", (f"{s}-live",)
            ).fetchone() == (True,)
        assert conn.execute("SELECT count(*) FROM pgjobs.edges").fetchone() == (1,)
        new_id = conn.execute("SELECT id FROM pgjobs.enqueue('after')").fetchone()
        assert new_id is not None and new_id[0] > max(r[0] for r in before)
        # purge removes the history, with the edge of the purged parent (no foreign key cascades any more)
        removed = conn.execute("SELECT pgjobs.purge(interval '0', interval '0')").fetchone()
        assert removed is not None and removed[0] == 3 * 5  # every finished job (the new ones are pending)
        assert conn.execute("SELECT count(*) FROM pgjobs.edges").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM pgjobs.job_keys WHERE unique_key = 'succeeded-key'").fetchone() == (
            0,
        )


def test_job_history_upgrades_in_place_under_load(blank_dsn: str) -> None:
    """job_history deployed while producers enqueue (enqueue and enqueue_many, which draws its ids before it
    inserts) and workers claim and complete: no job lost, none run twice, ids unique."""
    m.migrate(blank_dsn)
    m.rollback(blank_dsn, to=PLAN[PLAN.index("job_history") - 1])  # the revision before job_history
    with psycopg.connect(blank_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO pgjobs.jobs (kind) SELECT 'k' FROM generate_series(1, 2000)")
    stop = threading.Event()
    done: list[int] = []
    made: list[int] = []
    errors: list[str] = []

    def work() -> None:
        with psycopg.connect(blank_dsn, autocommit=True) as c:
            while not stop.is_set():
                try:
                    rows = c.execute("SELECT id, lease_token FROM pgjobs.claim('w', '{default}', 20)").fetchall()
                    if rows:
                        n = c.execute(
                            "SELECT pgjobs.complete_many(%s::bigint[], %s::uuid[])",
                            [[r[0] for r in rows], [r[1] for r in rows]],
                        ).fetchone()
                        assert n is not None and n[0] == len(rows)
                        done.extend(r[0] for r in rows)
                    else:
                        time.sleep(0.005)
                except psycopg.errors.UndefinedTable as exc:  # between the change and the functions' install
                    errors.append(str(exc))
                    time.sleep(0.01)

    def produce(many: bool) -> None:
        with psycopg.connect(blank_dsn, autocommit=True) as c:
            while not stop.is_set():
                try:
                    if many:
                        rows = c.execute(
                            'SELECT id FROM pgjobs.enqueue_many(\'[{"kind": "k"}, {"kind": "k"}, {"kind": "k"}]\')'
                        ).fetchall()
                        made.extend(r[0] for r in rows)
                    else:
                        row = c.execute("SELECT id FROM pgjobs.enqueue('k')").fetchone()
                        assert row is not None
                        made.append(row[0])
                except psycopg.errors.UndefinedTable as exc:
                    errors.append(str(exc))
                time.sleep(0.002)

    threads = [threading.Thread(target=work) for _ in range(3)]
    threads += [threading.Thread(target=produce, args=(many,)) for many in (False, True)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    assert m.migrate(blank_dsn).applied == PLAN[PLAN.index("job_history") :]  # job_history and the changes after it
    time.sleep(0.3)
    stop.set()
    for t in threads[3:]:
        t.join(30)
    expected = set(range(1, 2001)) | set(made)
    assert len(made) == len(set(made))  # ids stay unique across the identity's move
    stop.clear()
    workers = [threading.Thread(target=work) for _ in range(3)]
    for t in workers:
        t.start()
    deadline = time.monotonic() + 60
    while set(done) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    for t in threads[:3] + workers:
        t.join(30)
    assert sorted(done) == sorted(expected)  # every job once
    with psycopg.connect(blank_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT count(*), max(attempt) FROM pgjobs.jobs WHERE state = 'succeeded'").fetchone() == (
            len(expected),
            1,
        )
        assert conn.execute("SELECT count(*) FROM pgjobs.jobs_live").fetchone() == (0,)


def test_event_lz4_waits_out_a_writer_left_open_without_stalling_the_others(blank_dsn: str) -> None:
    """The change locks both event trees in tries of 200 ms: a transaction that enqueued and sits open holds
    it off (it is applied once that commits), and a writer arriving meanwhile is not stuck behind it."""
    m.migrate(blank_dsn)
    after = PLAN[PLAN.index("event_id_blocks") + 1 :]
    assert m.rollback(blank_dsn, to="event_id_blocks") == after[::-1]
    with psycopg.connect(blank_dsn) as holder, psycopg.connect(blank_dsn, autocommit=True) as other:
        holder.execute("SELECT * FROM pgjobs.enqueue(kind => 'open')")  # its transaction stays open
        other.execute("SET statement_timeout = '2s'")  # queued behind a lock request that waits: fails, not hangs
        result: dict[str, Any] = {}

        def run() -> None:
            t0 = time.monotonic()
            result["applied"] = m.migrate(blank_dsn).applied
            result["took"] = time.monotonic() - t0

        t = threading.Thread(target=run)
        t.start()
        time.sleep(0.5)
        t0 = time.monotonic()
        other.execute("SELECT * FROM pgjobs.enqueue(kind => 'meanwhile')")  # between two tries
        assert time.monotonic() - t0 < 1.0
        time.sleep(0.5)
        assert t.is_alive()  # still waiting for the open transaction
        holder.commit()
        t.join(20)
    assert result["applied"] == after
    assert result["took"] >= 1.0
    assert m.verify(blank_dsn) == PLAN


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

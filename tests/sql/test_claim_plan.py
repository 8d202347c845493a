"""The hot paths stay on their indexes with many jobs in the table, and the benchmark runs end to end.

PL/pgSQL statements cannot be EXPLAINed from outside, so the plans are read from inside: auto_explain
(``log_nested_statements``) hands every statement's plan, as JSON, to the client as a NOTICE. These are
the plans the functions really run: generic plans (the hot functions set ``plan_cache_mode =
force_generic_plan``), which cannot see how many jobs a LIMIT or an array holds, so a bad shape here is
a full scan in production.

Every test fills the table first and ANALYZEs it while no job is active: the statistics then say
"no active job", the situation in which the planner once preferred reading the partial index of active
jobs from end to end to a primary-key lookup.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.helpers.foundation import claim_index_visits

PENDING = 200_000
DONE = 100_000


def _fill(conn: psycopg.Connection[Any], pending: int = PENDING, done: int = DONE) -> None:
    conn.execute(
        "INSERT INTO pgjobs.jobs (kind, queue, payload, state, completed_at)"
        " SELECT 'plan.k', 'plan', '{\"n\": 1}', 'succeeded', now() FROM generate_series(1, %s)",
        (done,),
    )
    conn.execute(
        "INSERT INTO pgjobs.jobs (kind, queue, payload) SELECT 'plan.k', 'plan', '{\"n\": 1}'"
        " FROM generate_series(1, %s)",
        (pending,),
    )
    conn.execute("ANALYZE pgjobs.jobs")


class Plans:
    """Collects the JSON plans auto_explain sends as NOTICEs on one connection."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn
        self.plans: list[dict[str, Any]] = []
        try:
            conn.execute("LOAD 'auto_explain'")
        except psycopg.Error as exc:
            pytest.skip(f"auto_explain cannot be loaded here: {exc}")
        # JIT compiles a plan whose cost passes jit_above_cost, tens of milliseconds per call; the hot
        # functions turn it off. With the threshold at 0 here, any statement that could JIT would.
        self.jit = bool(conn.execute("SELECT pg_jit_available()").fetchone()[0])  # type: ignore[index]
        if self.jit:
            conn.execute("SET jit = on")
            conn.execute("SET jit_above_cost = 0")
        for setting, value in (
            ("auto_explain.log_min_duration", "0"),
            ("auto_explain.log_nested_statements", "on"),
            ("auto_explain.log_format", "json"),
            ("auto_explain.log_level", "notice"),
            ("client_min_messages", "notice"),
        ):
            conn.execute(f"SET {setting} = {value}")
        conn.add_notice_handler(self._on_notice)

    def _on_notice(self, diag: psycopg.errors.Diagnostic) -> None:
        text = diag.message_primary or ""
        if "plan:" not in text:
            return
        doc = json.loads(text.split("plan:", 1)[1])
        self.plans.append(doc)

    def clear(self) -> None:
        self.plans.clear()

    def statements(self) -> Iterator[tuple[str, dict[str, Any]]]:
        for p in self.plans:
            yield " ".join(p["Query Text"].split()), p["Plan"]

    def jitted(self) -> list[str]:
        """Statements on the jobs table that were JIT-compiled."""
        return [
            " ".join(p["Query Text"].split())[:200]
            for p in self.plans
            if p.get("JIT") and any(_is_jobs(n) for n in _nodes(p["Plan"]))
        ]


def _is_jobs(node: dict[str, Any]) -> bool:
    """A scan of jobs or of one of its partitions (jobs_live, the history slices)."""
    return str(node.get("Relation Name", "")) in ("jobs", "jobs_live") or _is_history(node)


def _is_history(node: dict[str, Any]) -> bool:
    return str(node.get("Relation Name", "")).startswith(("jobs_succeeded", "jobs_failed"))


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _assert_indexed(plans: Plans) -> set[str]:
    """No sequential scan of jobs, no index of jobs read without an index condition (a full index
    scan filtered row by row), no JIT. Returns the names of the jobs indexes used."""
    assert plans.jitted() == [], plans.jitted()
    used: set[str] = set()
    # A history slice the statistics call empty is scanned whole by any plan (there is nothing to read);
    # one that holds rows must be read by index like jobs_live.
    empty = {
        r[0]
        for r in plans.conn.execute(
            "SELECT c.relname::text FROM pg_class AS c WHERE c.relnamespace = 'pgjobs'::regnamespace"
            " AND c.relispartition AND c.reltuples <= 0"
        ).fetchall()
    }
    for query, plan in plans.statements():
        for node in _nodes(plan):
            if not _is_jobs(node) or (_is_history(node) and node["Relation Name"] in empty):
                continue
            kind = node["Node Type"]
            assert kind != "Seq Scan", f"sequential scan of {node['Relation Name']} in: {query[:1500]}"
            if kind in ("Index Scan", "Index Only Scan"):
                used.add(node["Index Name"])
                assert node.get("Index Cond"), (
                    f"{node['Index Name']} read without an index condition (a full index scan) in: {query[:300]}"
                )
        for node in _nodes(plan):
            if node["Node Type"] == "Bitmap Index Scan" and str(node.get("Index Name", "")).startswith("jobs"):
                used.add(node["Index Name"])
                assert node.get("Index Cond"), f"{node['Index Name']} without an index condition in: {query[:300]}"
    return used


@pytest.fixture
def plans(conn: psycopg.Connection[Any]) -> Plans:
    _fill(conn)
    return Plans(conn)


@pytest.mark.smoke
def test_claim_and_complete_stay_on_their_indexes(conn: psycopg.Connection[Any], plans: Plans) -> None:
    for _ in range(3):  # generic plans from the first call on; three rounds to be sure
        rows = conn.execute("SELECT id, lease_token FROM pgjobs.claim('w', '{plan}', 100)").fetchall()
        assert len(rows) == 100
        n = conn.execute(
            "SELECT pgjobs.complete_many(%s::bigint[], %s::uuid[])", ([r[0] for r in rows], [r[1] for r in rows])
        ).fetchone()
        assert n == (100,)
        one = conn.execute("SELECT id, lease_token FROM pgjobs.claim('w', '{plan}', 1)").fetchone()
        assert one is not None
        assert conn.execute("SELECT pgjobs.complete(%s, %s)", one).fetchone() == (True,)
    used = _assert_indexed(plans)
    assert "jobs_pending_idx" in used  # the claim reads pending jobs in claim order from their index
    assert "jobs_pkey" in used  # leases and completions find their rows by key
    _assert_live_only(plans)


def _assert_live_only(plans: Plans) -> None:
    """The hot statements are pruned to jobs_live at plan time (generic plans: from constants): none of
    them reads a history slice (DONE succeeded rows are there), nor even lists one as pruned at run time."""
    for query, plan in plans.statements():
        if "FROM jobs" not in query and "UPDATE jobs" not in query:
            continue
        history = [n["Relation Name"] for n in _nodes(plan) if _is_history(n)]
        assert history == [], f"{query[:300]} reads history partitions {history}"
        assert all(n.get("Subplans Removed", 0) == 0 for n in _nodes(plan)), f"pruned at run time only: {query[:300]}"


def test_claim_plans_with_many_jobs_running(conn: psycopg.Connection[Any], plans: Plans) -> None:
    # Thousands of running jobs the statistics know nothing of: every lease-token call must still
    # go by primary key, and the expired-lease probe by its index range.
    running = conn.execute("SELECT id, lease_token FROM pgjobs.claim('w', '{plan}', 5000)").fetchall()
    assert len(running) == 5000
    plans.clear()
    rows = conn.execute("SELECT id, lease_token FROM pgjobs.claim('w', '{plan}', 100)").fetchall()
    conn.execute("SELECT pgjobs.renew_leases(%s::bigint[], %s::uuid[])", ([r[0] for r in rows], [r[1] for r in rows]))
    conn.execute("SELECT pgjobs.complete_many(%s::bigint[], %s::uuid[])", ([r[0] for r in rows], [r[1] for r in rows]))
    job, token = running[0]
    conn.execute("SELECT pgjobs.renew_lease(%s, %s)", (job, token))
    conn.execute("SELECT pgjobs.checkpoint(%s, %s, '{\"at\": 1}')", (job, token))
    conn.execute("SELECT pgjobs.fail(%s, %s, 'boom')", (job, token))
    job, token = running[1]
    conn.execute("SELECT pgjobs.release(%s, %s)", (job, token))
    job, token = running[2]
    conn.execute("SELECT pgjobs.complete(%s, %s)", (job, token))
    used = _assert_indexed(plans)
    assert "jobs_pkey" in used
    _assert_live_only(plans)


def test_enqueue_paths_stay_on_their_indexes(conn: psycopg.Connection[Any], plans: Plans) -> None:
    for i in range(3):
        conn.execute("SELECT * FROM pgjobs.enqueue('plan.k', '{}', 'plan')")
        conn.execute("SELECT * FROM pgjobs.enqueue('plan.k', '{}', 'plan', unique_key => %s)", (f"u{i}",))
        conn.execute("SELECT * FROM pgjobs.enqueue('plan.k', '{}', 'plan', unique_key => %s)", (f"u{i}",))
        specs = [{"kind": "plan.k", "queue": "plan", "payload": {"n": j}} for j in range(50)]
        conn.execute("SELECT count(*) FROM pgjobs.enqueue_many(%s::jsonb)", (json.dumps(specs),))
        keyed = [{"kind": "plan.k", "queue": "plan", "unique_key": f"m{i}-{j % 5}"} for j in range(20)]
        conn.execute("SELECT count(*) FROM pgjobs.enqueue_many(%s::jsonb)", (json.dumps(keyed),))
    # A bounded queue counts its live jobs on every enqueue: on the live states' indexes, never by
    # reading the (mostly finished, mostly other queues') table.
    conn.execute("SELECT pgjobs.configure_queue('capped', max_length => 100)")
    for _ in range(3):
        conn.execute("SELECT * FROM pgjobs.enqueue('plan.k', '{}', 'capped')")
        conn.execute(
            "SELECT count(*) FROM pgjobs.enqueue_many(%s::jsonb)",
            (json.dumps([{"kind": "plan.k", "queue": "capped"}] * 3),),
        )
    _assert_indexed(plans)


def test_claim_time_does_not_grow_with_the_queue(conn: psycopg.Connection[Any]) -> None:
    """Not a timing: the work of one claim, in buffers touched, is the same at 20k and 200k pending."""

    def buffers_per_claim() -> int:
        plans = Plans(conn)
        conn.execute("SET auto_explain.log_analyze = on")
        conn.execute("SET auto_explain.log_buffers = on")
        conn.execute("SET auto_explain.log_timing = off")
        touched = []
        for _ in range(5):
            plans.clear()
            row = conn.execute("SELECT id, lease_token FROM pgjobs.claim('w', '{plan}', 10)").fetchall()
            conn.execute(
                "SELECT pgjobs.complete_many(%s::bigint[], %s::uuid[])", ([r[0] for r in row], [r[1] for r in row])
            )
            for query, plan in plans.statements():
                if query.startswith("WITH k AS"):
                    touched.append(plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0))
        conn.execute("RESET ALL")
        conn.remove_notice_handler(plans._on_notice)
        assert touched, "the claim statement was not seen"
        return min(touched)

    _fill(conn, pending=20_000, done=0)
    small = buffers_per_claim()
    conn.execute("TRUNCATE pgjobs.jobs CASCADE")
    _fill(conn, pending=PENDING, done=0)
    large = buffers_per_claim()
    # Ten times the queue costs at most one more level in each B-tree descent (one per index lookup
    # and insertion of the claimed rows), nowhere near ten times the work.
    assert large <= small * 1.5, (small, large)


def test_a_backlog_of_due_scheduled_jobs_does_not_slow_each_claim(conn: psycopg.Connection[Any]) -> None:
    """Due scheduled jobs are filed as pending a bounded number at a time: the work of one claim, in buffers
    touched by all its statements, is the same with 2,000 and 20,000 of them due (it was a sort of all)."""

    def buffers_per_claim(due: int) -> int:
        conn.execute("TRUNCATE pgjobs.jobs CASCADE")
        conn.execute(
            "INSERT INTO pgjobs.jobs (kind, queue, state, priority, run_at)"
            " SELECT 'plan.k', 'plan', 'scheduled', (g %% 3)::smallint, now() - interval '1 hour' + g * interval '1 ms'"
            " FROM generate_series(1, %s) AS g",
            (due,),
        )
        conn.execute("ANALYZE pgjobs.jobs")
        plans = Plans(conn)
        conn.execute("SET auto_explain.log_analyze = on")
        conn.execute("SET auto_explain.log_buffers = on")
        conn.execute("SET auto_explain.log_timing = off")
        totals = []
        for _ in range(5):
            plans.clear()
            rows = conn.execute("SELECT id, lease_token FROM pgjobs.claim('w', '{plan}', 10)").fetchall()
            assert len(rows) == 10
            totals.append(
                sum(p.get("Shared Hit Blocks", 0) + p.get("Shared Read Blocks", 0) for _, p in plans.statements())
            )
        conn.execute("RESET ALL")
        conn.remove_notice_handler(plans._on_notice)
        return min(totals)

    small = buffers_per_claim(2_000)
    large = buffers_per_claim(20_000)
    assert large <= small * 1.5, (small, large)


@pytest.mark.slow
def test_bench_quick_runs_end_to_end(pg_server_dsn: str, tmp_path: Path) -> None:
    from bench.__main__ import main

    out = tmp_path / "bench.json"
    assert main(["--quick", "--only", "core", "--dsn", pg_server_dsn, "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    (core,) = doc["suites"]
    assert not core.get("error"), core.get("error")
    names = {f["name"] for f in core["figures"]}
    assert {"enqueue, one per commit", "enqueue_many, batches of 1,000"} <= names
    for f in core["figures"]:
        assert isinstance(f["value"], int | float) and f["value"] > 0, f
        if f.get("baseline") is not None:
            assert f["ratio"] == pytest.approx(f["value"] / f["baseline"])
    # the suite ran in a database of its own, which is gone again
    assert str(core["database"]).startswith("bench_core_")
    with psycopg.connect(pg_server_dsn, autocommit=True) as admin:
        left = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (core["database"],)).fetchall()
    assert left == []


def _plans_made_on_one_job_then_a_backlog(conn: psycopg.Connection[Any]) -> Plans:
    """The session claims on a table of one job, then of none (its generic plans are made there), and
    20,000 pending jobs arrive with no ANALYZE after them. Returns the plan collector, emptied."""
    plans = Plans(conn)
    conn.execute("SELECT pgjobs.enqueue('plan.k', '{}', 'plan')")
    for _ in range(2):
        rows = conn.execute("SELECT id, lease_token FROM pgjobs.claim('w', '{plan}', 10)").fetchall()
        if rows:
            conn.execute(
                "SELECT pgjobs.complete_many(%s::bigint[], %s::uuid[])", ([r[0] for r in rows], [r[1] for r in rows])
            )
    conn.execute(
        "INSERT INTO pgjobs.jobs (kind, queue, payload) SELECT 'plan.k', 'plan', '{}' FROM generate_series(1, 20000)"
    )
    plans.clear()
    return plans


def test_plans_made_while_the_table_was_nearly_empty_stay_on_the_indexes(conn: psycopg.Connection[Any]) -> None:
    """A worker's session makes its generic plans at its first claim, often on a fresh or quiet jobs_live, and
    keeps them until the statistics change: with autovacuum off (or behind), or under a held snapshot that
    stops VACUUM, they never do. The claim's update of the rows it picked once became a sequential scan of
    jobs_live there, every claim reading the whole table (dead versions too): 2.5 -> 17 ms per claim in 35 s
    under a held snapshot at 3,000 jobs/s. Plans made on a one-job table must still read by index once the
    table holds many jobs, no ANALYZE in between."""
    plans = _plans_made_on_one_job_then_a_backlog(conn)
    for _ in range(3):
        rows = conn.execute("SELECT id, lease_token FROM pgjobs.claim('w', '{plan}', 50)").fetchall()
        assert len(rows) == 50
        conn.execute(
            "SELECT pgjobs.complete_many(%s::bigint[], %s::uuid[])", ([r[0] for r in rows], [r[1] for r in rows])
        )
    used = _assert_indexed(plans)
    assert "jobs_pending_idx" in used and "jobs_pkey" in used


def test_a_backlog_behind_plans_made_on_an_empty_table_is_read_in_claim_order_not_whole(
    conn: psycopg.Connection[Any],
) -> None:
    """Plans made on an empty jobs_live estimate one pending row, and for one row a bitmap of the queue's
    pending entries and a sort look cheaper than the index read in claim order. Once a backlog builds
    (a held snapshot, a burst), that bitmap reads the whole backlog, dead versions too, on every claim:
    in bench/soak.py at 11,800 jobs/s, 90 s into a held snapshot, a claim read 1.87 M entries of
    jobs_pending_idx and 870 k rows to take 50 (570 ms), claims fell behind, the backlog grew, and
    completions fell from 11,779 to 28 jobs/s. (A bitmap also never marks dead index entries, so every
    later scan pays for them again.) A claim must read the backlog in index order and stop at what it takes,
    and on the claims that follow, each from the floor the one before it left."""
    plans = _plans_made_on_one_job_then_a_backlog(conn)
    # active jobs whose leases ran out, for the claim's look for leases to settle or reclaim
    conn.execute("SELECT count(*) FROM pgjobs.claim('other', '{plan}', 2000, interval '1 second')")
    time.sleep(1.1)
    for second in (False, True):  # two claims in a row, each from the floor the claim before it left
        plans.clear()
        with conn.transaction():
            v0 = claim_index_visits(conn)
            rows = conn.execute("SELECT id, lease_token FROM pgjobs.claim('w', '{plan}', 50)").fetchall()
            visited = claim_index_visits(conn) - v0
            assert len(rows) == 50
        bitmaps = [
            (node["Node Type"], node.get("Relation Name") or node.get("Index Name"), query[:300])
            for query, plan in plans.statements()
            for node in _nodes(plan)
            if node["Node Type"].startswith("Bitmap")
            and (_is_jobs(node) or str(node.get("Index Name", "")).startswith("jobs"))
        ]
        assert bitmaps == [], bitmaps
        # the 2,000 expired leases and 50 pending jobs it takes, a few times over, not the 18,000 left behind
        assert visited < 10_000, (second, visited)

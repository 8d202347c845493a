"""Upgrade in place under load: ``pgjobs migrate`` applies the newest schema change(s) of the plan while
worker processes and a producer keep running: nothing lost, nothing run twice.

Generic over the plan, whatever it holds when the test runs; the starting point is, in this order:

* the revision before the newest plan change, from git: the newest commit whose ``migrations/sqitch.plan`` is
  a strict prefix of the current plan with the same deploy scripts (``git archive``). The database is built
  by that OLD code (its own migrator and functions) and that code's ``pgjobs.Worker`` runs through the
  upgrade: the newest change(s) applied under the previous release's workers;
* when git has no such revision (the plan is its baselines, created together): this checkout with the plan's
  last change reverted (``rollback(to=<the change before it>)``), this checkout's worker running while
  ``pgjobs migrate`` deploys that change again.

A producer process enqueues all along, recording each job in the same transaction, and a worker of this
checkout joins once the migration is done. The witness is a table the handlers write with the job id as
primary key: a second run of a job cannot hide. The test checks every enqueued job ran exactly once, ended
``succeeded`` on its first attempt, the first worker lived through the upgrade and stopped cleanly, and the
migrated database verifies.

Real processes only (``python -m pgjobs migrate`` included).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from io import BytesIO
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgjobs.ops import migrate as m
from tests.helpers.apps.procs import REPO, wait_for

pytestmark = pytest.mark.slow

APP = REPO / "tests" / "helpers" / "apps" / "upgrade_app.py"
PLAN = "migrations/sqitch.plan"
WITNESS_SQL = """
CREATE TABLE public.enqueued (job_id bigint PRIMARY KEY, at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE public.witness (job_id bigint PRIMARY KEY, attempt int NOT NULL, worker text NOT NULL,
                             at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE public.doubles (job_id bigint NOT NULL, attempt int NOT NULL, worker text NOT NULL);
"""


def _git(*args: str) -> bytes:
    return subprocess.run(["git", "-C", str(REPO), *args], check=True, capture_output=True, timeout=60).stdout


def _changes(plan_text: str) -> list[str]:
    """The change names of a sqitch plan's text (as pgjobs.ops.migrate.plan reads the file)."""
    names = []
    for raw in plan_text.splitlines():
        line = raw.strip()
        if line and not line.startswith(("%", "#", "@")):
            names.append(line.split()[0])
    return names


def _same_scripts(commit: str, changes: list[str]) -> bool:
    """Whether ``commit`` deploys each of ``changes`` with the script this checkout has (a plan squashed since
    may reuse a name for another change)."""
    for name in changes:
        path = f"migrations/deploy/{name}.sql"
        try:
            if _git("show", f"{commit}:{path}") != (REPO / path).read_bytes():
                return False
        except subprocess.CalledProcessError:
            return False
    return True


def old_revision() -> tuple[str, list[str]] | None:
    """(commit, its changes): the newest commit whose plan is a strict prefix of the current plan, with the
    same deploy scripts (the revision before the last plan change); None without git history or such a
    commit."""
    current = [c.name for c in m.plan()]
    try:
        commits = _git("rev-list", "HEAD", "--", PLAN).decode().split()
        head_plan = _changes(_git("show", f"HEAD:{PLAN}").decode())
    except (OSError, subprocess.CalledProcessError):
        return None
    # HEAD itself, when the plan's newest lines are not committed yet; else each plan commit's parent
    candidates = [("HEAD", head_plan)] if head_plan != current else []
    for commit in commits:
        try:
            parent_plan = _changes(_git("show", f"{commit}^:{PLAN}").decode())
        except subprocess.CalledProcessError:
            continue  # the commit that created the plan: no parent revision
        candidates.append((f"{commit}^", parent_plan))
    for commit, changes in candidates:
        prefix = bool(changes) and len(changes) < len(current) and current[: len(changes)] == changes
        if prefix and _same_scripts(commit, changes):
            return _git("rev-parse", commit).decode().strip(), changes
    return None


def extract(commit: str, into: Path) -> Path:
    """The old tree's code and SQL (``git archive``), to run with ``PYTHONPATH`` pointing at it."""
    data = _git("archive", "--format=tar", commit, "pgjobs", "sql", "migrations")
    with tarfile.open(fileobj=BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return into


class Fleet:
    """The test's processes, each logging to a file; every one still running at the end is killed."""

    def __init__(self, dsn: str, logs: Path) -> None:
        self.dsn, self.logs = dsn, logs
        self.procs: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(self, mode: str, name: str, code: Path) -> subprocess.Popen[bytes]:
        """``upgrade_app.py mode`` with ``code`` (an old tree, or this checkout) first on the path."""
        log = self.logs / f"{name}.log"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(code), str(REPO)]))
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, str(APP), mode, self.dsn, name], cwd=code, env=env, stdout=out, stderr=out
            )
        self.procs.append((proc, log))
        return proc

    def log(self, proc: subprocess.Popen[bytes]) -> str:
        return next(log.read_text(errors="replace") for p, log in self.procs if p is proc)

    def close(self) -> None:
        for proc, log in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
            text = log.read_text(errors="replace")[-3000:]
            sys.stderr.write(f"--- {log.name} (exit {proc.returncode}) ---\n{text}\n")


@pytest.fixture
def fleet(blank_dsn: str, tmp_path: Path) -> Iterator[Fleet]:
    f = Fleet(blank_dsn, tmp_path)
    try:
        yield f
    finally:
        f.close()


def count(conn: psycopg.Connection[Any], query: str) -> int:
    row = conn.execute(query).fetchone()
    assert row is not None
    return int(row[0])


# Run first in every process of old code: the checkout's editable install maps ``pgjobs`` here through a finder
# that would also answer for a submodule the old tree lacks (``pgjobs.ops`` before it existed) with this
# checkout's code. Without it, ``pgjobs`` is what PYTHONPATH says.
NO_EDITABLE = "import sys; sys.meta_path[:] = [f for f in sys.meta_path if '__editable__' not in type(f).__module__]"


def old_migrate(code: Path, dsn: str, changes: list[str]) -> None:
    """The old tree's own migrator (the module path of its day); the database then holds ``changes``."""
    module = "pgjobs.ops.migrate" if (code / "pgjobs" / "ops" / "migrate.py").exists() else "pgjobs.migrate"
    script = f"{NO_EDITABLE}\nfrom {module} import migrate\nmigrate(sys.argv[1])\n"
    env = dict(os.environ, PYTHONPATH=str(code))
    done = subprocess.run([sys.executable, "-c", script, dsn], cwd=code, env=env, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert m.status(dsn) == {c.name: c.name in changes for c in m.plan()}


def old_database(dsn: str, tmp_path: Path) -> tuple[Path, list[str]]:
    """The database at the revision before the newest plan change, built by that revision's code (or this
    checkout's with the last change reverted): (the code to run its workers with, its changes)."""
    found = old_revision()
    if found is not None:
        commit, old_changes = found
        code = extract(commit, tmp_path / "old")
        old_migrate(code, dsn, old_changes)
        return code, old_changes
    # the plan's baselines alone: the last one reverted, then deployed again under this checkout's worker
    plan = [c.name for c in m.plan()]
    assert len(plan) >= 2, "a plan of one change has nothing to apply on top of another"
    m.migrate(dsn)
    assert m.rollback(dsn, to=plan[-2]) == plan[-1:]
    return REPO, plan[:-1]


def migrate_to_head(dsn: str) -> str:
    """``pgjobs migrate`` of this checkout, in a process of its own; its output."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    upgrade = subprocess.run(
        [sys.executable, "-m", "pgjobs", "migrate", "--dsn", dsn], cwd=REPO, env=env, capture_output=True, timeout=300
    )
    out = upgrade.stdout.decode(errors="replace") + upgrade.stderr.decode(errors="replace")
    assert upgrade.returncode == 0, out
    return out


def test_migrate_to_head_while_workers_and_a_producer_run(blank_dsn: str, fleet: Fleet, tmp_path: Path) -> None:
    code, old_changes = old_database(blank_dsn, tmp_path)
    pending = [c.name for c in m.plan()][len(old_changes) :]
    assert pending, "nothing to upgrade"
    with psycopg.connect(blank_dsn, autocommit=True) as conn:
        conn.execute(WITNESS_SQL)
        old = fleet.start("worker", "old-worker", code)
        producer = fleet.start("producer", "producer", REPO)
        wait_for(lambda: count(conn, "SELECT count(*) FROM public.witness") >= 50, timeout=60, what="old worker busy")

        began = conn.execute("SELECT clock_timestamp()").fetchone()
        out = migrate_to_head(blank_dsn)
        ended = conn.execute("SELECT clock_timestamp()").fetchone()
        for change in pending:
            assert re.search(rf"\b{re.escape(change)}\b", out), f"{change} not reported applied: {out}"
        assert m.status(blank_dsn) == {c.name: True for c in m.plan()}

        assert old.poll() is None, "the old worker died during the upgrade:\n" + fleet.log(old)
        new = fleet.start("worker", "new-worker", REPO)
        # both run on after the upgrade: the old one must keep working on the new functions
        after = count(conn, "SELECT count(*) FROM public.witness")
        wait_for(
            lambda: count(conn, "SELECT count(*) FROM public.witness WHERE worker = 'new-worker'") >= 20
            and count(conn, "SELECT count(*) FROM public.witness") >= after + 100,
            timeout=60, what="both workers busy after the upgrade",
        )  # fmt: skip
        producer.send_signal(signal.SIGTERM)
        assert producer.wait(30) == 0
        wait_for(
            lambda: count(conn, "SELECT count(*) FROM pgjobs.jobs WHERE state <> 'succeeded'") == 0,
            timeout=90, what="every job to run",
        )  # fmt: skip
        for proc in (old, new):
            proc.send_signal(signal.SIGTERM)
        assert old.wait(60) == 0, fleet.log(old)
        assert new.wait(60) == 0, fleet.log(new)

        enqueued = {r[0] for r in conn.execute("SELECT job_id FROM public.enqueued").fetchall()}
        ran = {r[0] for r in conn.execute("SELECT job_id FROM public.witness").fetchall()}
        assert conn.execute("SELECT job_id, attempt, worker FROM public.doubles").fetchall() == []  # none ran twice
        assert ran == enqueued  # none lost, none run that was not enqueued
        jobs = conn.execute("SELECT state::text, attempt, count(*) FROM pgjobs.jobs GROUP BY 1, 2").fetchall()
        assert jobs == [("succeeded", 1, len(enqueued))]
        # the load really straddled the migration: jobs enqueued and run before it began and after it ended
        assert began is not None and ended is not None
        for table in ("enqueued", "witness"):
            row = conn.execute(
                f"SELECT count(*) FILTER (WHERE at < %s), count(*) FILTER (WHERE at > %s) FROM public.{table}",
                (began[0], ended[0]),
            ).fetchone()
            assert row is not None and row[0] > 0 and row[1] > 0, (table, row)
    assert m.verify(blank_dsn) == [c.name for c in m.plan()]


def most_in_a_second(times: list[Any]) -> int:
    """The most starts in any half-open window [t, t + 1 s)."""
    ts = sorted(t.timestamp() for t in times)
    best, lo = 0, 0
    for hi, t in enumerate(ts):
        while ts[lo] <= t - 1.0:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def test_migrate_to_head_while_rate_limited_workers_run(blank_dsn: str, fleet: Fleet, tmp_path: Path) -> None:
    """A worker of the old code claims from a key limited to 20 starts a second (queue rk) and from a queue
    limited to 15 (rq) while ``pgjobs migrate`` applies the newest change(s): it lives through the upgrade (no
    claim of it fails with an error it does not retry: the old bodies it runs find what they call), and no
    second holds more starts than the limit, counted from the attempts' start times across the switch."""
    code, _old_changes = old_database(blank_dsn, tmp_path)
    with psycopg.connect(blank_dsn, autocommit=True) as conn:
        if conn.execute("SELECT to_regclass('pgjobs.rate_limits')").fetchone() == (None,):
            pytest.skip("the old revision has no rate limits")
        conn.execute(WITNESS_SQL)
        conn.execute("SELECT pgjobs.configure_rate_limit('k', 20, '1 second')")
        conn.execute("SELECT pgjobs.configure_queue('rq', max_starts => 15, per => '1 second')")
        conn.execute(
            "SELECT count(*) FROM pgjobs.enqueue_many((SELECT jsonb_agg(jsonb_build_object('kind', 'witness',"
            " 'queue', q, 'rate_key', CASE WHEN q = 'rk' THEN 'k' END)) FROM unnest('{rk,rq}'::text[]) AS q,"
            " generate_series(1, 1000)))"
        )
        old = fleet.start("rated", "old-rated", code)
        wait_for(lambda: count(conn, "SELECT count(*) FROM public.witness") >= 40, timeout=60, what="old worker busy")
        began = conn.execute("SELECT clock_timestamp()").fetchone()
        migrate_to_head(blank_dsn)
        ended = conn.execute("SELECT clock_timestamp()").fetchone()
        assert began is not None and ended is not None
        assert old.poll() is None, "the old worker died during the upgrade:\n" + fleet.log(old)
        wait_for(
            lambda: count(conn, f"SELECT count(*) FROM public.witness WHERE at > '{ended[0].isoformat()}'") >= 40,
            timeout=60, what="the old worker busy after the upgrade",
        )  # fmt: skip
        old.send_signal(signal.SIGTERM)
        assert old.wait(60) == 0, fleet.log(old)
        assert conn.execute("SELECT job_id, attempt, worker FROM public.doubles").fetchall() == []
        for queue, allowed in (("rk", 20), ("rq", 15)):
            starts = [
                r[0]
                for r in conn.execute(
                    "SELECT first_started_at FROM pgjobs.jobs WHERE queue = %s AND first_started_at IS NOT NULL",
                    [queue],
                )
            ]
            assert any(t < began[0] for t in starts) and any(t > ended[0] for t in starts), queue
            assert most_in_a_second(starts) <= allowed, queue

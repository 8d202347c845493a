"""``pgjobs.cli.demo`` end to end, in real subprocesses: on the embedded server (which must be gone afterwards,
also after SIGTERM), on a given database, and split like docker/compose.yaml (a worker process plus
``demo --no-worker``)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgjobs.ops import embedded

REPO = Path(__file__).resolve().parents[2]
DEMO_QUEUE = "pgjobs-demo"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PGJOBS_DSN", "DATABASE_URL", "PGJOBS_DATA_DIR")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    return env


def _pgjobs(*args: str) -> list[str]:
    return [sys.executable, "-m", "pgjobs", *args]


def _server_processes(data_dir: Path) -> list[str]:
    """Live processes whose command line names ``data_dir`` (the postmaster runs ``postgres -D <dir>``)."""
    found = []
    needle = str(data_dir).encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            state = (proc / "stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if needle in cmdline and state not in ("Z", "X"):
            found.append(proc.name + ": " + cmdline.replace(b"\0", b" ").decode(errors="replace"))
    return found


@pytest.fixture
def data_dir() -> Iterator[Path]:
    """A fresh embedded data dir below a world-traversable directory (as root the server runs as another user)."""
    base = Path(tempfile.mkdtemp(prefix="pgjobs-demo-test-"))
    base.chmod(0o755)
    try:
        yield base / "pgdata"
    finally:
        if embedded.server_pid(base / "pgdata") is not None:  # never leave one behind, even on failure
            embedded.start(base / "pgdata")
            embedded.stop(base / "pgdata", force=True)
        shutil.rmtree(base, ignore_errors=True)


def _assert_no_server(data_dir: Path) -> None:
    deadline = time.monotonic() + 5
    while _server_processes(data_dir) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _server_processes(data_dir) == []
    assert embedded.server_pid(data_dir) is None


@pytest.mark.slow
def test_demo_on_the_embedded_server_finishes_and_leaves_no_server(data_dir: Path) -> None:
    p = subprocess.run(
        _pgjobs("demo", "--data-dir", str(data_dir), "--plain"), capture_output=True, text=True, env=_env(), timeout=120
    )
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    assert "pgjobs demo on PostgreSQL" in out and "fresh database 'pgjobs_demo_" in out
    header = " ".join(out.split("pgjobs demo on PostgreSQL", 1)[1].split("\n\n", 1)[0].split())
    assert "schema installed" in header and "lean_jobs" not in out  # no migration names
    assert "attempt 1: started from the beginning, ran chunks 1-5, then crashed" in out
    assert "attempt 2: resumed from its checkpoint at chunk 6, ran chunks 6-12" in out
    assert "every chunk ran exactly once" in out
    assert "server stopped" in out
    _assert_no_server(data_dir)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_demo_stops_the_server_on_a_signal(data_dir: Path, sig: signal.Signals) -> None:
    proc = subprocess.Popen(
        _pgjobs("demo", "--data-dir", str(data_dir), "--plain"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(),
        # as from a terminal: a suite started in the background (`cmd &` in a script) passes SIGINT on as
        # ignored, and the demo rightly keeps an inherited SIG_IGN (it is not what this test is about)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:  # wait until the worker runs jobs
            seen.append(line)
            if line.startswith("worker:"):
                break
        assert embedded.server_pid(data_dir) is not None, "".join(seen)
        time.sleep(0.5)
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == (143 if sig == signal.SIGTERM else 130), "".join(seen) + out
    assert "demo interrupted" in out
    _assert_no_server(data_dir)


@pytest.mark.slow
def test_demo_on_a_given_database_creates_nothing_else(dsn: str, pg_server_dsn: str) -> None:
    with psycopg.connect(pg_server_dsn, autocommit=True) as admin:
        databases = {r[0] for r in admin.execute("SELECT datname FROM pg_database").fetchall()}
    p = subprocess.run(_pgjobs("--dsn", dsn, "demo"), capture_output=True, text=True, env=_env(), timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "the jobs stay in queue 'pgjobs-demo'" in p.stdout
    with psycopg.connect(pg_server_dsn, autocommit=True) as admin:
        after = {r[0] for r in admin.execute("SELECT datname FROM pg_database").fetchall()}
    # The server is shared (other sessions' test and bench databases come and go meanwhile): what the demo
    # could have made is a database of its own naming, pgjobs_demo_<pid>.
    assert {d for d in after - databases if d.startswith("pgjobs_demo")} == set()
    _assert_showcase_done(dsn)


def _assert_showcase_done(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        states = dict(
            conn.execute(
                "SELECT state::text, count(*) FROM pgjobs.jobs WHERE queue = %s GROUP BY 1", [DEMO_QUEUE]
            ).fetchall()
        )
        other = conn.execute("SELECT count(*) FROM pgjobs.jobs WHERE queue <> %s", [DEMO_QUEUE]).fetchone()
        report: Any = conn.execute(
            "SELECT state::text, checkpoint FROM pgjobs.jobs WHERE kind = 'demo.nightly_report'"
        ).fetchone()
    assert set(states) == {"succeeded", "failed", "cancelled"}, states
    assert states["failed"] == 4 and states["cancelled"] == 1  # the declined cards, the job cancelled ahead
    assert other == (0,)  # only the demo queue was touched
    assert report[0] == "succeeded"
    runs = report[1]["runs"]
    assert [(r["attempt"], r["first"], r["last"], r["crashed"]) for r in runs] == [(1, 1, 5, True), (2, 6, 12, False)]


@pytest.mark.slow
def test_demo_split_like_compose_a_worker_process_and_the_enqueuer(dsn: str) -> None:
    worker = subprocess.Popen(
        # a short fallback poll keeps this test quick whatever the worker's wake-up at retry times does
        _pgjobs(
            *("--dsn", dsn, "worker", "--app", "pgjobs.cli.demo_app:app", "--queues", f"{DEMO_QUEUE}=20"),
            *("--poll-interval", "0.5"),
        ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    try:
        p = subprocess.run(
            _pgjobs("--dsn", dsn, "demo", "--no-worker"), capture_output=True, text=True, env=_env(), timeout=120
        )
        assert p.returncode == 0, p.stdout + p.stderr
        assert "waiting for a worker" in p.stdout and "every chunk ran exactly once" in p.stdout
        _assert_showcase_done(dsn)
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.communicate()
    assert worker.returncode == 143  # stopped by SIGTERM


@pytest.mark.smoke
def test_demo_no_worker_needs_a_dsn() -> None:
    p = subprocess.run(_pgjobs("demo", "--no-worker"), capture_output=True, text=True, env=_env(), timeout=60)
    assert p.returncode == 2
    assert p.stderr.strip().startswith("pgjobs: --no-worker needs") and len(p.stderr.strip().splitlines()) == 1

"""What a newcomer trips on at the command line: values the database would refuse with the wrong error, the
lease token in JSON output, a 20 MB payload on the terminal, enqueue without the app's declared defaults,
and the exit code of a worker stopped by a signal."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psycopg
import pytest

from pgjobs import Client
from pgjobs.cli.main import main
from tests.cli.test_cli import REPO, cli_json, run_cli


def _count(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM pgjobs.jobs").fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--priority", "40000"], "40000"),
        (["--priority", "-40000"], "-40000"),
        (["--payload", "[1, 2]"], "[1, 2]"),
        (["--payload", '"hi"'], "'hi'"),
        (["--payload", "null"], "None"),
    ],
)
def test_enqueue_refuses_what_the_database_would_misread_with_exit_1(
    dsn: str, capsys: pytest.CaptureFixture[str], args: list[str], named: str
) -> None:
    assert main(["--dsn", dsn, "enqueue", "k", *args]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("pgjobs: job: ") and named in err and len(err.splitlines()) == 1, err
    assert _count(dsn) == 0


def test_purge_takes_36500_days(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--dsn", dsn, "purge", "--succeeded-before", "36500d", "--failed-before", "36500d"]) == 0
    assert capsys.readouterr().out.strip() == "purged 0 job(s)"


def test_json_output_never_carries_the_lease_token(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    with Client(dsn) as client:
        job = client.enqueue("k", {})
        lease = client.claim("w", ["default"])[0]
    token = str(lease.lease_token)
    status = cli_json(capsys, "--dsn", dsn, "status", str(job.id), "--json")
    assert status["state"] == "active" and status["leased_by"] == "w" and "lease_token" not in status
    listed = cli_json(capsys, "--dsn", dsn, "jobs", "--json")
    assert [j["id"] for j in listed] == [job.id] and "lease_token" not in listed[0]
    assert main(["--dsn", dsn, "status", str(job.id)]) == 0
    assert main(["--dsn", dsn, "jobs"]) == 0
    assert token not in capsys.readouterr().out

    # --follow --json: the first line is the active job; the end comes once the job completes
    follow = subprocess.Popen(
        [sys.executable, "-m", "pgjobs", "--dsn", dsn, "status", str(job.id), "--follow", "--json"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert follow.stdout is not None
        first = follow.stdout.readline()
        assert json.loads(first)["state"] == "active", first
        with Client(dsn) as client:
            assert client.complete(lease.id, lease.lease_token, {"ok": True})
        rest, err = follow.communicate(timeout=60)
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.communicate()
    assert follow.returncode == 0, err
    lines = [json.loads(line) for line in [first, *rest.splitlines()]]
    assert lines[-1]["type"] == "job" and lines[-1]["state"] == "succeeded"
    assert token not in first + rest and all("lease_token" not in line for line in lines)


def test_status_cuts_a_large_payload_result_and_progress(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [{"row": i, "text": "x" * 20} for i in range(60_000)]  # ~2.4 MB of JSON
    with Client(dsn) as client:
        job = client.enqueue("big", {"rows": rows})
        lease = client.claim("w", ["default"])[0]
        assert client.progress(lease.id, lease.lease_token, {"seen": rows[:20_000]})
    assert main(["--dsn", dsn, "status", str(job.id)]) == 0
    out = capsys.readouterr().out
    assert len(out.splitlines()) < 120, len(out.splitlines())
    assert out.count("(truncated, ") == 2 and "bytes in all)" in out
    size = len(json.dumps({"rows": rows}, ensure_ascii=False).encode())
    assert f"(truncated, {size:,} bytes in all)" in out
    # --json is data: the payload comes whole
    whole = cli_json(capsys, "--dsn", dsn, "status", str(job.id), "--json")
    assert whole["payload"] == {"rows": rows}


def test_enqueue_with_app_takes_the_kinds_declared_defaults(dsn: str, tmp_path: Path) -> None:
    (tmp_path / "declared_app.py").write_text(
        textwrap.dedent(
            """
            import pgjobs

            app = pgjobs.App()

            @app.job("slow.report", queue="slow", max_attempts=2, priority=4)
            def report(payload, ctx):
                return None
            """
        )
    )
    made = []
    for extra in ([], ["--queue", "other", "--max-attempts", "7"], ["--priority", "0"]):
        p = run_cli("--dsn", dsn, "enqueue", "slow.report", "--app", "declared_app:app", "--json", *extra, cwd=tmp_path)
        assert p.returncode == 0, p.stderr
        made.append(json.loads(p.stdout)["id"])
    without = run_cli("--dsn", dsn, "enqueue", "slow.report", "--json", cwd=tmp_path)
    made.append(json.loads(without.stdout)["id"])
    unknown = run_cli("--dsn", dsn, "enqueue", "nobody.handles", "--app", "declared_app:app", cwd=tmp_path)
    assert unknown.returncode == 0 and "not declared by declared_app:app" in unknown.stderr, unknown.stderr
    with psycopg.connect(dsn) as conn:
        got = conn.execute(
            "SELECT queue, max_attempts, priority FROM pgjobs.jobs WHERE id = ANY (%s) ORDER BY id", [made]
        ).fetchall()
    assert got == [("slow", 2, 4), ("other", 7, 4), ("slow", 2, 0), ("default", 20, 0)]
    missing = run_cli("--dsn", dsn, "enqueue", "k", "--app", "no_such_module_xyz:app", cwd=tmp_path)
    assert missing.returncode == 4 and "no module named" in missing.stderr


def test_worker_stopped_by_ctrl_c_exits_130(dsn: str, tmp_path: Path) -> None:
    (tmp_path / "idle_app.py").write_text("import pgjobs\napp = pgjobs.App()\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgjobs", "--dsn", dsn, "worker", "--app", "idle_app:app", "--grace-period", "5"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        with psycopg.connect(dsn, autocommit=True) as conn:  # registered: its signal handlers are installed
            while conn.execute("SELECT count(*) FROM pgjobs.workers").fetchone() == (0,):
                assert time.monotonic() < deadline and proc.poll() is None, "the worker did not start"
                time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert "Traceback" not in err  # a graceful stop, not a KeyboardInterrupt


def test_stats_and_status_say_when_no_live_worker_takes_a_kind(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    with Client(dsn) as client:
        client.worker_heartbeat("w-1", {"queues": {"default": 4}, "kinds": ["known"], "heartbeat_interval": 60})
        mystery = client.enqueue("mystery_kind", {})
        known = client.enqueue("known", {})
        client.enqueue("known", {}, queue="nowhere")
    assert main(["--dsn", dsn, "stats"]) == 0
    out = capsys.readouterr().out
    assert "not running: 1 mystery_kind job(s) in queue default: no live worker handles this kind" in out
    assert "not running: 1 known job(s) in queue nowhere: no live worker serves this queue" in out
    stats = cli_json(capsys, "--dsn", dsn, "stats", "--json")
    assert [(u["queue"], u["kind"], u["served"]) for u in stats["unhandled"]] == [
        ("default", "mystery_kind", True), ("nowhere", "known", False),
    ]  # fmt: skip
    assert main(["--dsn", dsn, "status", str(mystery.id)]) == 0
    assert "no live worker handles this kind" in capsys.readouterr().out
    assert main(["--dsn", dsn, "status", str(known.id)]) == 0
    assert "no live worker" not in capsys.readouterr().out

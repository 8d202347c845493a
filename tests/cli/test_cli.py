"""The ``pgjobs`` command line, against a real database: commands, output, and exit codes.

Most tests call ``pgjobs.cli.main([...])`` in-process (fast); the exit-code contract and the worker
command are also checked through a real ``python -m pgjobs`` subprocess.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgjobs import Client
from pgjobs.cli.main import _expected, main, parse_duration, parse_queues, progress_fraction
from pgjobs.ops import dsn as dsnmod

REPO = Path(__file__).resolve().parents[2]
UNREACHABLE = "postgresql://postgres@127.0.0.1:1/x"


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60, cwd: Path | None = None) -> Any:
    """``python -m pgjobs ARGS`` in a subprocess; returns the CompletedProcess."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("PGJOBS_DSN", "DATABASE_URL")}
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), full_env.get("PYTHONPATH", "")]))
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "pgjobs", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        cwd=cwd or REPO,
    )


def cli_json(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    capsys.readouterr()
    assert main(list(args)) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


# ---------------------------------------------------------------------------------------------------------
# exit codes


@pytest.mark.smoke
def test_unreachable_database_is_exit_2_with_one_line() -> None:
    p = run_cli("--dsn", UNREACHABLE, "stats")
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("pgjobs: cannot connect to the database")
    assert "port=1" in lines[0] and p.stdout == ""


def test_unreachable_database_also_fails_migrate_and_enqueue(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--dsn", UNREACHABLE, "migrate"]) == 2
    assert main(["enqueue", "k", "--dsn", UNREACHABLE]) == 2  # --dsn after the command works too
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("pgjobs: cannot connect") for line in err)


def test_a_server_error_of_class_operational_is_not_called_unreachable(dsn: str) -> None:
    """psycopg files a lock timeout (55P03) under OperationalError, as it does a refused connection: the
    command line says what the server said, not "cannot connect"."""
    with psycopg.connect(dsn) as holder, psycopg.connect(dsn, autocommit=True) as waiter:
        holder.execute("LOCK TABLE pgjobs.queues IN ACCESS EXCLUSIVE MODE")
        waiter.execute("SET lock_timeout = '50ms'")
        with pytest.raises(psycopg.OperationalError) as caught:
            waiter.execute("SELECT count(*) FROM pgjobs.queues")
    err = _expected(caught.value, argparse.Namespace(dsn=dsn, where=None))
    assert err is not None
    assert "cannot connect" not in str(err) and "[55P03]" in str(err), err
    refused = _expected(psycopg.OperationalError("connection refused"), argparse.Namespace(dsn=dsn, where=None))
    assert refused is not None and "cannot connect" in str(refused)


@pytest.mark.smoke
def test_unmigrated_database_is_exit_3(blank_dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    for command in (["stats"], ["jobs"], ["enqueue", "k"], ["status", "1"], ["cancel", "1"]):
        assert main(["--dsn", blank_dsn, *command]) == 3, command
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 5
    assert all("has no pgjobs schema" in line and "pgjobs migrate" in line for line in err)


def test_bad_arguments_are_exit_2(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--dsn", dsn, "enqueue", "k", "--payload", "{not json"]) == 2
    assert "invalid JSON" in capsys.readouterr().err
    assert main(["--dsn", dsn, "purge"]) == 2
    assert main(["--dsn", dsn, "migrate", "--to", "core"]) == 2  # --to needs --rollback
    assert main(["--dsn", dsn, "worker", "--app", "x:y", "--queues", "default=0"]) == 2
    assert main(["--dsn", dsn, "jobs", "--state", "nonsense"]) == 2
    assert main(["--dsn", "nonsense=1", "stats"]) == 2  # a DSN libpq cannot parse
    assert main([]) == 2


def test_pgjobs_errors_are_exit_1_with_the_message(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--dsn", dsn, "status", "424242"]) == 1
    assert capsys.readouterr().err.strip() == "pgjobs: job 424242 not found"
    assert main(["--dsn", dsn, "cancel", "424242"]) == 1  # PJ003 from SQL
    assert "424242" in capsys.readouterr().err
    job = cli_json(capsys, "--dsn", dsn, "enqueue", "k", "--json")
    assert main(["--dsn", dsn, "retry", str(job["id"])]) == 1  # PJ004: pending jobs cannot be retried
    err = capsys.readouterr().err.strip()
    assert err.startswith("pgjobs: ") and "pending" in err and len(err.splitlines()) == 1


def test_unknown_app_is_exit_4(dsn: str, tmp_path: Path) -> None:
    (tmp_path / "not_an_app.py").write_text("app = 42\n")
    for spec, words in [
        ("no_such_module_xyz:app", "no module named 'no_such_module_xyz'"),
        ("pgjobs.cli:no_such_attribute", "has no attribute 'no_such_attribute'"),
        ("not_an_app:app", "not a pgjobs.App"),
        (":app", "expected module:attribute"),
    ]:
        p = run_cli("--dsn", dsn, "worker", "--app", spec, cwd=tmp_path)
        assert p.returncode == 4, (spec, p.stderr)
        assert words in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


# ---------------------------------------------------------------------------------------------------------
# commands


@pytest.mark.smoke
def test_migrate_status_verify_rollback(blank_dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--dsn", blank_dsn, "migrate", "--status"]) == 1  # nothing deployed yet
    assert main(["--dsn", blank_dsn, "migrate"]) == 0
    assert "applied core" in capsys.readouterr().out
    assert main(["--dsn", blank_dsn, "migrate"]) == 0
    assert "schema up to date; functions up to date" in capsys.readouterr().out
    assert main(["--dsn", blank_dsn, "migrate", "--status"]) == 0
    out = capsys.readouterr().out
    assert "core" in out and "functions: up to date" in out
    assert main(["--dsn", blank_dsn, "migrate", "--verify"]) == 0
    assert "verified" in capsys.readouterr().out
    assert main(["--dsn", blank_dsn, "stats"]) == 0
    assert main(["--dsn", blank_dsn, "migrate", "--rollback", "--to", "no-such-change"]) == 2
    assert main(["--dsn", blank_dsn, "migrate", "--rollback", "--yes"]) == 0
    assert "reverted" in capsys.readouterr().out
    assert main(["--dsn", blank_dsn, "stats"]) == 3


def test_enqueue_status_jobs_stats(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    first = cli_json(
        capsys,
        *("--dsn", dsn, "enqueue", "email.send", "--payload", '{"to": "a@example.com"}', "--queue", "emails"),
        *("--priority", "3", "--max-attempts", "5", "--group-key", "tenant-1", "--json"),
    )
    assert first["created"] is True and first["state"] == "pending"
    later = cli_json(capsys, "--dsn", dsn, "enqueue", "report", "--run-at", "10m", "--unique-key", "r1", "--json")
    assert later["state"] == "scheduled"
    again = cli_json(capsys, "--dsn", dsn, "enqueue", "report", "--unique-key", "r1", "--json")
    assert again == {"id": later["id"], "created": False, "state": "scheduled"}

    # the human output says the same in one line
    assert main(["--dsn", dsn, "enqueue", "report", "--unique-key", "r1"]) == 0
    assert capsys.readouterr().out.strip() == f"job {later['id']} already exists (unique key 'r1'), state scheduled"

    job = cli_json(capsys, "--dsn", dsn, "status", str(first["id"]), "--json")
    assert (job["kind"], job["queue"], job["payload"], job["priority"], job["max_attempts"], job["group_key"]) == (
        "email.send",
        "emails",
        {"to": "a@example.com"},
        3,
        5,
        "tenant-1",
    )
    assert main(["--dsn", dsn, "status", str(first["id"])]) == 0
    out = capsys.readouterr().out
    assert "email.send" in out and "pending" in out and "a@example.com" in out

    listed = cli_json(capsys, "--dsn", dsn, "jobs", "--json")
    assert [j["id"] for j in listed] == [later["id"], first["id"]]  # newest first
    assert [j["id"] for j in cli_json(capsys, "--dsn", dsn, "jobs", "--queue", "emails", "--json")] == [first["id"]]
    assert [j["id"] for j in cli_json(capsys, "--dsn", dsn, "jobs", "--search", "REP", "--json")] == [later["id"]]
    assert cli_json(capsys, "--dsn", dsn, "jobs", "--state", "active", "--json") == []
    assert main(["--dsn", dsn, "jobs", "--limit", "1"]) == 0
    assert str(later["id"]) in capsys.readouterr().out

    stats = cli_json(capsys, "--dsn", dsn, "stats", "--json")
    counts = {(s["queue"], s["state"]): s["jobs"] for s in stats["queues"]}
    assert counts == {("emails", "pending"): 1, ("default", "scheduled"): 1}
    assert main(["--dsn", dsn, "stats"]) == 0
    out = capsys.readouterr().out
    assert "emails" in out and "scheduled" in out and "no workers" in out


def test_stats_lists_workers(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    with Client(dsn) as client:
        client.worker_heartbeat("host-a-123", {"host": "host-a", "pid": 123, "queues": {"default": 10}})
    stats = cli_json(capsys, "--dsn", dsn, "stats", "--json")
    assert [w["id"] for w in stats["workers"]] == ["host-a-123"]
    assert main(["--dsn", dsn, "stats"]) == 0
    out = capsys.readouterr().out
    assert "host-a-123" in out and "default=10" in out


def test_cancel_retry_purge(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    job = cli_json(capsys, "--dsn", dsn, "enqueue", "k", "--json")
    assert main(["--dsn", dsn, "cancel", str(job["id"])]) == 0
    assert capsys.readouterr().out.strip() == f"job {job['id']} cancelled"
    assert main(["--dsn", dsn, "cancel", str(job["id"])]) == 1
    assert "already cancelled" in capsys.readouterr().err
    assert main(["--dsn", dsn, "retry", str(job["id"])]) == 0
    assert capsys.readouterr().out.strip() == f"job {job['id']} is pending again"

    with Client(dsn) as client:
        claimed = client.claim("w", ["default"])[0]
        assert client.complete(claimed.id, claimed.lease_token)
        running = client.enqueue("long")
        lease = client.claim("w", ["default"])[0]
        assert lease.id == running.id
    assert main(["--dsn", dsn, "cancel", str(running.id)]) == 0
    assert "asked to stop" in capsys.readouterr().out

    assert main(["--dsn", dsn, "purge", "--succeeded-before", "1d"]) == 0
    assert capsys.readouterr().out.strip() == "purged 0 job(s)"
    assert main(["--dsn", dsn, "purge", "--succeeded-before", "0s", "--failed-before", "30d"]) == 0
    assert capsys.readouterr().out.strip() == "purged 1 job(s)"
    assert cli_json(capsys, "--dsn", dsn, "jobs", "--json")[0]["id"] == running.id


def test_status_follow_streams_until_terminal(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    with Client(dsn) as client:
        job = client.enqueue("slow")

        def work() -> None:
            time.sleep(0.3)
            c = client.claim("w", ["default"])[0]
            time.sleep(0.2)
            client.progress(c.id, c.lease_token, {"done": 1, "total": 2})
            time.sleep(0.2)
            client.complete(c.id, c.lease_token, {"ok": True})

        t = threading.Thread(target=work)
        t.start()
        try:
            t0 = time.monotonic()
            assert main(["--dsn", dsn, "status", str(job.id), "--follow"]) == 0
            assert time.monotonic() - t0 < 10
        finally:
            t.join()
    out = capsys.readouterr().out
    assert "succeeded" in out.splitlines()[-1]
    assert "active" in out  # the transition was streamed, not only the end

    # a job that is already terminal: one line, the exit code says how it ended
    assert main(["--dsn", dsn, "status", str(job.id), "--follow"]) == 0
    with Client(dsn) as client:
        bad = client.enqueue("bad", max_attempts=1)
        c = client.claim("w", ["default"])[0]
        client.fail(c.id, c.lease_token, "boom")
    assert main(["--dsn", dsn, "status", str(bad.id), "--follow"]) == 1
    assert "failed" in capsys.readouterr().out


def test_dsn_from_environment(dsn: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGJOBS_DSN", raising=False)
    monkeypatch.setenv("DATABASE_URL", dsn)
    assert main(["stats", "--json"]) == 0
    monkeypatch.setenv("PGJOBS_DSN", UNREACHABLE)  # PGJOBS_DSN wins over DATABASE_URL ...
    assert main(["stats"]) == 2
    assert main(["--dsn", dsn, "stats"]) == 0  # ... and --dsn over both


def test_dsn_resolution_order_and_normalisation() -> None:
    env = {"PGJOBS_DSN": "postgresql://a/x", "DATABASE_URL": "postgresql://b/y"}
    assert dsnmod.configured("postgresql://c/z", env) == ("postgresql://c/z", "--dsn")
    assert dsnmod.configured(None, env) == ("postgresql://a/x", "PGJOBS_DSN")
    assert dsnmod.configured(None, {"DATABASE_URL": "postgres+asyncpg://u@h/db"}) == (
        "postgres://u@h/db",
        "DATABASE_URL",
    )
    assert dsnmod.configured("  ", {"PGJOBS_DSN": ""}) is None  # blank means unset: the embedded server
    with pytest.raises(dsnmod.DsnError):
        dsnmod.configured("nonsense=1", {})
    assert "secret" not in dsnmod.redact("postgresql://u:secret@h/db")


def test_embedded_data_dir_is_never_under_root_home() -> None:
    path = dsnmod.data_dir(None)
    if os.geteuid() == 0:
        assert not str(path).startswith("/root")
    assert dsnmod.data_dir("/tmp/x/pgdata") == Path("/tmp/x/pgdata")


def test_parsers() -> None:
    assert parse_duration("7d") == timedelta(days=7)
    assert parse_duration("1d12h") == timedelta(days=1, hours=12)
    assert parse_duration("90") == timedelta(seconds=90)
    for bad in ("", "7x", "d", "1d foo"):
        with pytest.raises(Exception, match="invalid duration"):
            parse_duration(bad)
    assert parse_queues("default=10, emails=5") == {"default": 10, "emails": 5}
    assert parse_queues("default,emails=2") == {"default": None, "emails": 2}
    assert progress_fraction(0.5) == 0.5
    assert progress_fraction({"done": 1, "total": 4}) == 0.25
    assert progress_fraction({"percent": 40}) == 0.4
    assert progress_fraction({"stage": "x"}) is None
    assert progress_fraction(7) is None


def test_worker_command_runs_jobs_and_stops_on_sigterm(dsn: str, tmp_path: Path) -> None:
    (tmp_path / "cli_test_app.py").write_text(
        textwrap.dedent(
            """
            import psycopg
            import pgjobs

            app = pgjobs.App()

            @app.job("cli.record", queue="cli")
            def record(payload, ctx):
                with psycopg.connect(payload["dsn"], autocommit=True) as conn:
                    conn.execute("INSERT INTO cli_effects VALUES (%s)", [payload["n"]])
                return {"n": payload["n"]}
            """
        )
    )
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE cli_effects (n int)")
    env = {k: v for k, v in os.environ.items() if k not in ("PGJOBS_DSN", "DATABASE_URL")}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgjobs", "--dsn", dsn, "worker", "--app", "cli_test_app:app", "--queues", "cli=4"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with Client(dsn) as client:
            ids = [client.enqueue("cli.record", {"dsn": dsn, "n": n}, queue="cli").id for n in range(5)]
        p = run_cli("--dsn", dsn, "status", str(ids[-1]), "--follow", timeout=60)
        assert p.returncode == 0, p.stderr
        deadline = time.monotonic() + 30
        with Client(dsn) as client:
            while time.monotonic() < deadline:
                states = {client.job_status(i).state.value for i in ids}  # type: ignore[union-attr]
                if states == {"succeeded"}:
                    break
                time.sleep(0.05)
        assert states == {"succeeded"}
        with psycopg.connect(dsn, autocommit=True) as conn:
            assert sorted(r[0] for r in conn.execute("SELECT n FROM cli_effects")) == list(range(5))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert proc.returncode == 143, err  # 128 + SIGTERM, as the README's exit codes say
    assert "cli_test_app:app" in err  # the banner names the app and its queues


def test_bench_delegates_every_argument(capsys: pytest.CaptureFixture[str]) -> None:
    # `--help` after `bench` is the benchmark's own, not pgjobs'
    assert main(["bench", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: pgjobs bench") and "python -m bench" not in out  # (it once said python -m)

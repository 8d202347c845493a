"""A newcomer's first hour in the command line: ``jobs`` pages and says "N of M", ``--search`` matches payload text,
the last error is the exception's own line, ``status --follow --json`` streams lines as things happen, and
``worker --app`` without ``--queues`` serves every queue the app declares."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import textwrap
import time
import traceback
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgjobs import Client
from pgjobs.cli.common import error_line
from pgjobs.cli.main import main

REPO = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PGJOBS_DSN", "DATABASE_URL")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    return env


def _out(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    capsys.readouterr()
    assert main(list(args)) == 0, capsys.readouterr().err
    return capsys.readouterr().out


def test_jobs_pages_and_says_n_of_m(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    with Client(dsn) as client:
        ids = [j.id for j in client.enqueue_many([{"kind": "k", "payload": {"n": n}} for n in range(7)])]
    out = _out(capsys, "--dsn", dsn, "jobs", "--limit", "3")
    assert "jobs 1-3 of 7 (page 1 of 3; --page 2 for the next)" in out
    out = _out(capsys, "--dsn", dsn, "jobs", "--limit", "3", "--page", "3")
    assert "jobs 7-7 of 7 (page 3 of 3)" in out
    assert [
        j["id"] for j in json.loads(_out(capsys, "--dsn", dsn, "jobs", "--limit", "3", "--page", "2", "--json"))
    ] == [
        ids[3],
        ids[2],
        ids[1],
    ]
    out = _out(capsys, "--dsn", dsn, "jobs", "--limit", "3", "--offset", "5")
    assert "jobs 6-7 of 7" in out
    assert main(["--dsn", dsn, "jobs", "--page", "1", "--offset", "2"]) == 2  # one or the other


def test_search_matches_payload_text(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    with Client(dsn) as client:
        hit = client.enqueue("send_email", {"to": "Ada@Example.com"}).id
        client.enqueue("send_email", {"to": "bob@example.com"})
        assert [j.id for j in client.list_jobs(search="ada@example")] == [hit]  # before: no match
        assert client.count_jobs(search="example.COM") == 2
        assert client.count_jobs(search="nothing-like-it") == 0
    listed = json.loads(_out(capsys, "--dsn", dsn, "jobs", "--search", "ada@", "--json"))
    assert [j["id"] for j in listed] == [hit]


def _traceback_text() -> str:
    def inner() -> None:
        raise ValueError("boom")

    try:
        inner()
    except ValueError as exc:
        return "".join(traceback.format_exception(exc)).rstrip()
    raise AssertionError


def test_last_error_is_the_exceptions_line(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    text = _traceback_text()
    assert error_line(text) == "ValueError: boom"
    assert error_line("plain text from another language") == "plain text from another language"
    with Client(dsn) as client:
        job = client.enqueue("k", max_attempts=3)
        claimed = client.claim("w", max_jobs=1)[0]
        client.fail(claimed.id, claimed.lease_token, text)
    out = _out(capsys, "--dsn", dsn, "jobs")
    assert "ValueError: boom" in out and "Traceback" not in out  # before: "Traceback (most recent call…"
    out = _out(capsys, "--dsn", dsn, "status", str(job.id))
    assert "ValueError: boom" in out and "Traceback" not in out
    out = _out(capsys, "--dsn", dsn, "status", str(job.id), "--errors")
    assert "Traceback (most recent call last):" in out and 'raise ValueError("boom")' in out  # the history


def _read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    if not sel.select(timeout):
        raise AssertionError(f"no line within {timeout} s")
    return proc.stdout.readline()


def test_status_follow_json_streams_one_object_per_line(dsn: str) -> None:
    with Client(dsn) as client:
        job = client.enqueue("k")
        proc = subprocess.Popen(
            [sys.executable, "-m", "pgjobs", "--dsn", dsn, "status", str(job.id), "--follow", "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
        )
        try:
            first = json.loads(_read_line(proc, 30))  # before the fix: nothing until the job ended
            assert first["type"] == "job" and first["state"] == "pending" and first["id"] == job.id
            time.sleep(0.5)  # the stream is listening
            claimed = client.claim("w", max_jobs=1)[0]
            client.progress(claimed.id, claimed.lease_token, {"done": 1, "total": 2})
            seen: list[dict[str, Any]] = []
            while not any(e.get("state") == "active" for e in seen):
                seen.append(json.loads(_read_line(proc, 30)))  # the job is still running: lines come as they happen
            assert all(e["type"] == "event" for e in seen)
            client.complete(claimed.id, claimed.lease_token, {"ok": True})
            out, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
    lines = [json.loads(line) for line in out.splitlines()]
    assert proc.returncode == 0, err
    assert lines[-1]["type"] == "job" and lines[-1]["state"] == "succeeded" and lines[-1]["result"] == {"ok": True}


def test_worker_without_queues_serves_every_declared_queue(dsn: str, tmp_path: Path) -> None:
    (tmp_path / "fh_app.py").write_text(
        textwrap.dedent(
            """
            import pgjobs

            app = pgjobs.App()

            @app.job("send_email", queue="emails", max_attempts=5)
            def send_email(payload, ctx):
                return {"sent": payload["to"]}

            @app.job("resize", queue="images")
            async def resize(payload, ctx):
                return {"resized": True}
            """
        )
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgjobs", "--dsn", dsn, "worker", "--app", "fh_app:app", "--concurrency", "2"],
        cwd=tmp_path,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with Client(dsn) as client:
            a = client.enqueue("send_email", {"to": "ada"}, queue="emails").id
            b = client.enqueue("resize", queue="images").id
            deadline = time.monotonic() + 30
            states: set[str] = set()
            while time.monotonic() < deadline:  # before the fix: only `default` was served, neither ran
                states = {client.job_status(i).state.value for i in (a, b)}  # type: ignore[union-attr]
                if states == {"succeeded"}:
                    break
                time.sleep(0.05)
        assert states == {"succeeded"}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert "serving queues emails=2, images=2 (every queue the app declares" in " ".join(err.split()), err


def test_worker_queues_default_to_the_declared_ones() -> None:
    from pgjobs.cli.worker import worker_queues

    assert worker_queues(None, 4, ["emails", "images"]) == {"emails": 4, "images": 4}
    assert worker_queues(None, 4, []) == {"default": 4}
    assert worker_queues({"emails": None, "x": 2}, 4, ["emails"]) == {"emails": 4, "x": 2}


# ---------------------------------------------------------------------------------------------------------
# item 8: the small ones


def test_web_help_explains_host_and_port(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["web", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--host HOST address to bind" in out and "--port PORT TCP port" in out


def test_dashboard_api_hides_lease_tokens(dsn: str) -> None:
    # (the dashboard is the ASGI app of pgjobs/web now; tests/web covers every page and API call)
    from pgjobs.web.config import WebConfig
    from tests.web.support import TOKEN, free_port, start_web, stop_web

    with Client(dsn) as client:
        client.enqueue("k")
        claimed = client.claim("w", max_jobs=1)[0]
    web = start_web(WebConfig(dsn=dsn, port=free_port(), token=TOKEN))
    try:
        s = web.client()
        for path in ("/api/jobs", f"/api/jobs/{claimed.id}"):
            body = s.get(path).text
            assert "lease_token" not in body and str(claimed.lease_token) not in body, path
            assert '"leased_by":"w"' in body, path  # the rest of the row is there
    finally:
        stop_web(web)


def test_removing_a_code_schedule_names_the_cli_switch(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    from datetime import UTC, datetime, timedelta

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "SELECT pgjobs.upsert_schedule('nightly', 'k', '0 3 * * *', %s, code_defined => true)",
            (datetime.now(UTC) + timedelta(hours=1),),
        )
    capsys.readouterr()
    assert main(["--dsn", dsn, "schedules", "remove", "nightly"]) == 1
    err = capsys.readouterr().err
    assert "pgjobs schedules remove nightly --force" in err and "force => true" not in err
    assert main(["--dsn", dsn, "schedules", "remove", "nightly", "--force"]) == 0


def test_the_distribution_is_pgjobs_queue_with_import_and_command_pgjobs() -> None:
    # "pgjobs" on the package index is somebody else's project
    import importlib.metadata

    import pgjobs

    dist = importlib.metadata.distribution("pgjobs-queue")
    scripts = {ep.name: ep.value for ep in dist.entry_points if ep.group == "console_scripts"}
    assert scripts == {"pgjobs": "pgjobs.cli:main"}
    assert pgjobs.__version__ == dist.version
    pyproject = (REPO / "pyproject.toml").read_text()
    assert 'name = "pgjobs-queue"' in pyproject and '"pgjobs-queue[embedded]"' in pyproject

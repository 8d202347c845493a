"""``pgjobs web`` as a user starts it: the generated token printed, the extra's install hint."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time

import httpx
import pytest

from pgjobs.cli.main import main


def test_pgjobs_web_prints_a_generated_token_and_serves(dsn: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PGJOBS_WEB_TOKEN"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgjobs", "--dsn", dsn, "web", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(2)]
        bound = re.search(r"http://127\.0\.0\.1:(\d+)/", lines[0])
        assert bound, lines
        port = int(bound.group(1))
        assert port > 0
        found = re.search(r"login token \(generated.*\): (\S+)", lines[1])
        assert found, lines
        token = found.group(1)
        deadline = time.monotonic() + 15
        while True:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/api/jobs", headers={"Authorization": f"Bearer {token}"})
                break
            except httpx.ConnectError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        assert r.status_code == 200 and r.json() == {"total": 0, "offset": 0, "jobs": []}
        assert httpx.get(f"http://127.0.0.1:{port}/api/jobs").status_code == 401
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def test_without_the_web_extra_it_says_how_to_install_it(
    dsn: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # as if not installed: import raises ImportError
    assert main(["--dsn", dsn, "web", "--token", "t"]) == 2
    assert "pip install 'pgjobs-queue[web]'" in capsys.readouterr().err


def test_a_port_in_use_is_one_line_not_a_traceback(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["--dsn", dsn, "web", "--token", "t", "--port", str(port)]) == 2
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err


def test_a_role_name_that_is_not_an_identifier_is_refused(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--dsn", dsn, "web", "--token", "t", "--role", "x -c log_statement=all"]) == 2
    assert "invalid role name" in capsys.readouterr().err

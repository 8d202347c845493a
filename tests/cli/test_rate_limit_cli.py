"""``pgjobs rate-limit``, ``pgjobs rate-limits``, ``pgjobs enqueue --rate-key`` and ``pgjobs queue configure
--max-starts --per`` (pgjobs/cli/rates.py)."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from pgjobs.cli import main


def _json(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    assert main(list(args)) == 0
    return json.loads(capsys.readouterr().out)


def test_limits_from_the_command_line(
    dsn: str, conn: psycopg.Connection[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    made = _json(capsys, "--dsn", dsn, "rate-limit", "api", "50", "1s", "--burst", "5", "--json")
    assert (made["key"], made["max_starts"], made["burst"]) == ("api", 50, 5)
    job = _json(capsys, "--dsn", dsn, "enqueue", "fetch", "--rate-key", "api", "--json")
    assert conn.execute("SELECT rate_key FROM pgjobs.jobs WHERE id = %s", [job["id"]]).fetchone() == ("api",)
    assert main(["--dsn", dsn, "queue", "configure", "reports", "--max-starts", "10", "--per", "1m"]) == 0
    capsys.readouterr()
    assert main(["--dsn", dsn, "rate-limits"]) == 0
    out = capsys.readouterr().out
    assert "key 'api': 50 starts per 1 s (+ burst 5); 55 token(s) now" in out  # an empty window
    assert "queue 'reports': 10 starts per 60 s" in out
    assert main(["--dsn", dsn, "rate-limit", "api", "0"]) == 0
    assert capsys.readouterr().out.strip() == "rate key 'api': no limit"
    assert main(["--dsn", dsn, "rate-limit", "api", "-1", "1s"]) == 2  # refused by the parser, nothing sent

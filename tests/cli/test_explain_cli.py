"""``pgjobs explain ID [--json]`` against a real database."""

from __future__ import annotations

import json

import pytest

from pgjobs import Client
from pgjobs.cli.main import main


def test_explain_text_json_and_unknown_id(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    with Client(dsn) as client:
        client.worker_heartbeat("w", {"queues": {"reports": 1}})
        client.configure_queue("reports", fair=True, max_active_per_group=1)
        first = client.enqueue("render", queue="reports", group_key="tenant-1")
        second = client.enqueue("render", queue="reports", group_key="tenant-1")
        (got,) = client.claim("w", ["reports"])
        assert got.id == first.id

    capsys.readouterr()
    assert main(["--dsn", dsn, "explain", str(second.id)]) == 0
    out = capsys.readouterr().out.strip()
    assert out == f"job {second.id}: group 'tenant-1' of queue 'reports' is at its cap: 1 of 1 active"

    assert main(["--dsn", dsn, "explain", str(second.id), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "reason": "group_cap", "queue": "reports", "group_key": "tenant-1", "active": 1, "max_active_per_group": 1,
    }  # fmt: skip

    assert main(["--dsn", dsn, "explain", str(first.id), "--json"]) == 0
    running = json.loads(capsys.readouterr().out)
    assert running["reason"] == "running" and running["worker"] == "w"
    assert str(got.lease_token) not in json.dumps(running)  # never the token

    assert main(["--dsn", dsn, "explain", "424242"]) == 1
    assert capsys.readouterr().err.strip() == "pgjobs: job 424242 not found"

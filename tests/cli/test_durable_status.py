"""``pgjobs status`` of a job using durable execution: its steps done with their results' size, sleeping until,
waiting for a signal since (and ``--json`` carries the same under ``durable``)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pgjobs import Client
from pgjobs.cli.durable_view import size
from pgjobs.cli.main import main


def status(capsys: pytest.CaptureFixture[str], dsn: str, id: int, *more: str) -> str:
    capsys.readouterr()
    assert main(["--dsn", dsn, "status", str(id), *more]) == 0
    return capsys.readouterr().out


def test_status_shows_steps_sleeps_and_waits(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    with Client(dsn) as client:
        waiter = client.enqueue("saga", {}).id
        sleeper = client.enqueue("nap", {}).id
        plain = client.enqueue("plain", {}).id
        jobs: dict[int, Any] = {j.id: j for j in client.claim("w", max_jobs=3)}
        assert client.record_step(waiter, jobs[waiter].lease_token, "charge", {"tx": "x" * 1500})
        assert client.await_signal(waiter, jobs[waiter].lease_token, "wait#1", "ship:42", 3600).outcome == "parked"
        nap = client.sleep_until(sleeper, jobs[sleeper].lease_token, "sleep#1", jobs[sleeper].lease_expires_at)
        assert nap.outcome == "parked"
        out = status(capsys, dsn, waiter)
        assert "steps done" in out and "charge (1.5 kB)" in out
        assert "waiting for" in out and "signal 'ship:42' since" in out and "times out" in out
        assert "sleeping until" in status(capsys, dsn, sleeper)
        plain_out = status(capsys, dsn, plain)
        assert "steps done" not in plain_out and "waiting for" not in plain_out
        as_json = json.loads(status(capsys, dsn, waiter, "--json"))
        assert [s["name"] for s in as_json["durable"]["steps"]] == ["charge"]
        assert as_json["durable"]["waiting_for"]["key"] == "ship:42"
        assert "durable" not in json.loads(status(capsys, dsn, plain, "--json"))


def test_sizes_read_as_a_person_reads_them() -> None:
    assert [size(n) for n in (12, 1500, 2_500_000)] == ["12 B", "1.5 kB", "2.5 MB"]

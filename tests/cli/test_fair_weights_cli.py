"""``pgjobs queue weight QUEUE GROUP WEIGHT`` and the weights ``pgjobs queue show`` / ``queue configure`` list
(pgjobs/cli/queue.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

import pgjobs
from pgjobs.cli import main


def _json(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    assert main(list(args)) == 0
    return json.loads(capsys.readouterr().out)


def _out(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(list(args)) == 0
    return capsys.readouterr().out


def test_set_show_and_reset_a_weight(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    _out(capsys, "--dsn", dsn, "queue", "configure", "reports", "--fair")
    said = _out(capsys, "--dsn", dsn, "queue", "weight", "reports", "tenant-1", "3")
    assert said.strip() == "queue 'reports' group 'tenant-1': weight 3"
    made = _json(capsys, "--dsn", dsn, "queue", "weight", "reports", "tenant-2", "0.5", "--json")
    assert made == {"queue": "reports", "group_key": "tenant-2", "weight": 0.5, "fair": True}
    with pgjobs.Client(dsn) as client:
        for group in ("tenant-1", "tenant-2", "tenant-3"):
            client.enqueue("render", {}, queue="reports", group_key=group)
        client.claim("w", ["reports"], max_jobs=1)

    shown = _json(capsys, "--dsn", dsn, "queue", "show", "reports", "--json")
    weights = {g["group_key"]: g["weight"] for g in shown["fair_groups"]}
    assert weights == {"tenant-1": 3.0, "tenant-2": 0.5, "tenant-3": 1.0}
    assert shown["groups"] == 3
    served = [g for g in shown["fair_groups"] if g["last_served_at"] is not None]
    assert len(served) == 1 and served[0]["served"] > 0
    table = _out(capsys, "--dsn", dsn, "queue", "show", "reports")
    assert "groups of reports with pending work at its last claim" in table
    rows = {line.split()[1]: line.split() for line in table.splitlines() if "tenant-" in line}
    assert (rows["tenant-1"][3], rows["tenant-2"][3], rows["tenant-3"][3]) == ("3", "0.5", "1")
    assert "never" in rows["tenant-3"] or "never" in rows["tenant-2"]
    every = _json(capsys, "--dsn", dsn, "queue", "show", "--json")
    assert [q["fair_groups"][0]["weight"] for q in every if q["queue"] == "reports"] == [3.0]  # heaviest first
    configured = _out(capsys, "--dsn", dsn, "queue", "configure", "reports", "--max-active", "9")
    assert "groups of reports" in configured

    said = _out(capsys, "--dsn", dsn, "queue", "weight", "reports", "tenant-1", "1")
    assert said.strip() == "queue 'reports' group 'tenant-1': weight 1 (the default)"
    shown = _json(capsys, "--dsn", dsn, "queue", "show", "reports", "--json")
    assert {g["group_key"]: g["weight"] for g in shown["fair_groups"]}["tenant-1"] == 1.0


def test_a_weight_on_a_queue_not_fair_says_so(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    said = _out(capsys, "--dsn", dsn, "queue", "weight", "plain", "tenant-1", "2")
    assert said.strip() == (
        "queue 'plain' group 'tenant-1': weight 2; the queue is not fair: weights apply once it is"
        " (pgjobs queue configure plain --fair)"
    )
    assert _json(capsys, "--dsn", dsn, "queue", "show", "plain", "--json")["fair_groups"] == []


@pytest.mark.parametrize("bad", ["0", "-1", "1001", "nan", "inf", "heavy"])
def test_a_bad_weight_is_refused_before_the_database(dsn: str, capsys: pytest.CaptureFixture[str], bad: str) -> None:
    assert main(["--dsn", dsn, "queue", "weight", "reports", "tenant-1", bad]) == 2
    err = capsys.readouterr().err
    assert "argument WEIGHT: expected a number in (0, 1000]" in err and bad in err


def test_a_refusal_from_sql_is_one_line_and_exit_1(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--dsn", dsn, "queue", "weight", "reports", "", "2"]) == 1
    err = capsys.readouterr().err
    assert err == "pgjobs: group_key must be a non-empty string, got ''\n"

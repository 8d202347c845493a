"""``pgjobs maintain``: one maintenance pass of the status stream, printed."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from pgjobs.cli.main import main


def test_maintain_prints_what_the_pass_did(
    dsn: str, conn: psycopg.Connection[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    conn.execute("SELECT pgjobs.enqueue('k')")
    # a committed row in an inbox partition that is not the current one: the pass ticks and truncates it
    row = conn.execute(
        "INSERT INTO pgjobs.event_inbox (slot, xid, at, ids, states, queues, kinds, attempts, batch_ids)"
        " VALUES (mod(floor(extract(epoch FROM now()) / 15)::bigint + 2, 4), pg_current_xact_id(), now(),"
        " '{99}', '{pending}', '{default}', '{aged}', '{0}', '{NULL}') RETURNING slot"
    ).fetchone()
    assert row is not None
    capsys.readouterr()
    assert main(["--dsn", dsn, "maintain", "--json"]) == 0
    actions = json.loads(capsys.readouterr().out)
    assert {"action": "tick", "target": "event_log", "rows": 2} in actions
    truncated = [a["target"] for a in actions if a["action"] == "truncate"]
    # The inbox partitions rotate every 15 s: when a boundary passed between the enqueue and the pass,
    # the enqueue's partition is no longer the current one and is emptied too (its row is ticked above).
    assert f"event_inbox_{row[0]}" in truncated
    assert len(truncated) <= 2
    assert main(["--dsn", dsn, "maintain"]) == 0
    out = capsys.readouterr().out
    assert "tick" in out and "event_log" in out
    kinds = [r[0] for r in conn.execute("SELECT kind FROM pgjobs.read_events()").fetchall()]
    assert kinds == ["k", "aged"]

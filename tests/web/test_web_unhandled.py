"""The dashboard says when no live worker takes a kind: a line on the overview, a badge on the job's page."""

from __future__ import annotations

import pgjobs
from tests.web.support import RunningWeb


def test_overview_and_job_page_name_kinds_no_live_worker_takes(dsn: str, web: RunningWeb) -> None:
    with pgjobs.Client(dsn) as client:
        client.worker_heartbeat("w-1", {"queues": {"default": 4}, "kinds": ["known"], "heartbeat_interval": 60})
        mystery = client.enqueue("mystery_kind", {})
        known = client.enqueue("known", {})
    s = web.client()
    overview = s.get("/").text
    assert 'id="unhandled"' in overview and "<code>mystery_kind</code>" in overview
    assert "no live worker handles this kind" in overview and "<code>known</code>" not in overview
    page = s.get(f"/jobs/{mystery.id}").text
    assert 'id="not-taken">no live worker handles this kind<' in page
    assert 'id="not-taken"' not in s.get(f"/jobs/{known.id}").text

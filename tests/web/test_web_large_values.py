"""A job carrying megabytes of JSON: its page shows the start of the payload, result, checkpoint and progress
with a "truncated, N bytes" marker instead of the whole value (the API still has them whole)."""

from __future__ import annotations

import json

import pgjobs
from tests.web.support import RunningWeb


def test_the_job_page_cuts_large_values_and_the_api_keeps_them(dsn: str, web: RunningWeb) -> None:
    rows = [{"row": i, "text": "x" * 20} for i in range(60_000)]  # ~2.4 MB of JSON each
    with pgjobs.Client(dsn) as client:
        job = client.enqueue("big", {"rows": rows})
        lease = client.claim("w", ["default"])[0]
        assert client.checkpoint(lease.id, lease.lease_token, {"rows": rows})
        assert client.progress(lease.id, lease.lease_token, {"seen": rows})
    s = web.client()
    page = s.get(f"/jobs/{job.id}")
    assert page.status_code == 200
    assert len(page.content) < 200_000, len(page.content)  # three values of 2.4 MB each, uncut: over 7 MB
    size = len(json.dumps({"rows": rows}, indent=2, sort_keys=True, ensure_ascii=False).encode())
    assert f"(truncated, {size:,} bytes in all)" in page.text  # payload and checkpoint
    assert page.text.count("(truncated, ") == 3  # and the progress
    whole = s.get(f"/api/jobs/{job.id}").json()
    assert whole["payload"] == {"rows": rows} and whole["checkpoint"] == {"rows": rows}


def test_a_small_job_page_is_not_marked(dsn: str, web: RunningWeb) -> None:
    with pgjobs.Client(dsn) as client:
        job = client.enqueue("small", {"rows": [1, 2, 3]})
    page = web.client().get(f"/jobs/{job.id}").text
    assert "truncated" not in page and "rows" in page

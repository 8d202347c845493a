"""The job page's durable-execution block: steps done with their results' size, sleeping until, waiting for a
signal since; absent for a job that recorded none."""

from __future__ import annotations

from typing import Any

from pgjobs import Client
from tests.web.support import RunningWeb


def test_job_page_shows_steps_and_what_the_job_is_parked_on(dsn: str, web: RunningWeb) -> None:
    with Client(dsn) as client:
        waiter = client.enqueue("saga", {}).id
        sleeper = client.enqueue("nap", {}).id
        plain = client.enqueue("plain", {}).id
        jobs: dict[int, Any] = {j.id: j for j in client.claim("w", max_jobs=3)}
        assert client.record_step(waiter, jobs[waiter].lease_token, "charge", {"tx": "abc"})
        assert client.await_signal(waiter, jobs[waiter].lease_token, "wait#1", "ship:7", 3600).outcome == "parked"
        nap = client.sleep_until(sleeper, jobs[sleeper].lease_token, "sleep#1", jobs[sleeper].lease_expires_at)
        assert nap.outcome == "parked"
    s = web.client()
    page = s.get(f"/jobs/{waiter}").text
    assert 'id="durable"' in page and "<code>charge</code>" in page and "13 B" in page  # {"tx": "abc"}
    assert 'id="waiting-for"' in page and "<code>ship:7</code>" in page and "times out" in page
    assert 'id="sleeping-until"' in s.get(f"/jobs/{sleeper}").text
    assert 'id="durable"' not in s.get(f"/jobs/{plain}").text

"""The job page's "why not running" line (pgjobs.explain), read through the reader role."""

from __future__ import annotations

from collections.abc import Callable

from pgjobs import Client
from tests.web.support import RunningWeb


def test_job_page_says_why_a_job_is_not_running(dsn: str, make_web: Callable[..., RunningWeb]) -> None:
    web = make_web(role="pgjobs_reader")
    with Client(dsn) as client:
        client.worker_heartbeat("w", {"queues": {"mail": 1}})
        held = client.enqueue("mail.send", queue="mail")
        client.configure_queue("mail", paused=True)
        running = client.enqueue("report")
        client.worker_heartbeat("w2", {"queues": ["default"]})
        (got,) = client.claim("w2")
        assert got.id == running.id
    s = web.client()
    page = s.get(f"/jobs/{held.id}").text
    assert (
        '<p class="why" id="why-not-running"><strong>why not running:</strong> queue &#39;mail&#39; is paused</p>'
        in page
    )
    assert 'id="why-not-running"' not in s.get(f"/jobs/{running.id}").text  # running: the summary says where

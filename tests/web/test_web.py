"""The dashboard: JSON endpoints, actions, and the live Server-Sent Events stream, on a real server."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

import pgjobs
from pgjobs.web.server import serve


@pytest.fixture
def web(dsn: str) -> Iterator[str]:
    server = serve(dsn, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _get(url: str) -> object:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def _post(url: str) -> tuple[int, object]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.mark.smoke
def test_endpoints_show_jobs_and_actions_change_them(dsn: str, web: str) -> None:
    with pgjobs.Client(dsn) as client:
        a = client.enqueue("report", {"n": 1}, queue="reports")
        client.enqueue("email", {"n": 2})
        assert {(s["queue"], s["state"], s["jobs"]) for s in _get(f"{web}/api/stats")} == {  # type: ignore[union-attr,index]
            ("reports", "pending", 1),
            ("default", "pending", 1),
        }
        jobs = _get(f"{web}/api/jobs?queue=reports")
        assert [j["id"] for j in jobs] == [a.id]  # type: ignore[union-attr,index]
        assert _get(f"{web}/api/jobs/{a.id}")["state"] == "pending"  # type: ignore[index]

        assert _post(f"{web}/api/jobs/{a.id}/cancel") == (200, {"id": a.id, "action": "cancel", "done": True})
        assert client.job_status(a.id).state == "cancelled"  # type: ignore[union-attr]
        assert _post(f"{web}/api/jobs/{a.id}/retry")[0] == 200
        assert client.job_status(a.id).state == "pending"  # type: ignore[union-attr]
        status, body = _post(f"{web}/api/jobs/{a.id}/retry")  # a pending job cannot be retried: PJ004
        assert status == 409 and "only failed or cancelled" in body["error"]  # type: ignore[index]
        assert _post(f"{web}/api/jobs/999999/cancel")[0] == 404


def test_unknown_job_and_bad_id(web: str) -> None:
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(f"{web}/api/jobs/424242", timeout=10)
    assert missing.value.code == 404
    with pytest.raises(urllib.error.HTTPError) as bad:
        urllib.request.urlopen(f"{web}/api/jobs/abc", timeout=10)
    assert bad.value.code == 400


def test_page_and_live_events(dsn: str, web: str) -> None:
    with urllib.request.urlopen(f"{web}/", timeout=10) as r:
        assert b"<title>pgjobs</title>" in r.read()
    stream = urllib.request.urlopen(f"{web}/api/events", timeout=10)
    try:
        assert stream.readline() == b": listening\n"  # LISTEN is in place before we enqueue
        stream.readline()
        with pgjobs.Client(dsn) as client:
            job = client.enqueue("ping", {})
        line = stream.readline()
        assert line.startswith(b"data: ")
        event = json.loads(line[len(b"data: ") :])
        assert event == {
            "id": job.id,
            "state": "pending",
            "queue": "default",
            "kind": "ping",
            "attempt": 0,
            "batch_id": None,
        }
    finally:
        stream.close()

"""Every page and action against a real database: what each page shows, filters and "N of M", the
actions, 4xx for bad parameters, the banner when the database is down, and /metrics."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

import pgjobs
from tests.web.seed import seed
from tests.web.support import TOKEN, RunningWeb, free_port


def _shown(first: int, last: int, total: int) -> str:
    return f'<span id="count">{first}\u2013{last} of {total}</span>'


def _post(web: RunningWeb, s: httpx.Client, path: str, **form: str | list[str]) -> httpx.Response:
    return s.post(path, data={"csrf_token": web.csrf(), **form}, headers={"Origin": web.url})


@pytest.mark.smoke
def test_pages_show_the_seeded_state(dsn: str, web: RunningWeb) -> None:
    data = seed(dsn)
    s = web.client()
    overview = s.get("/").text
    assert 'id="queues"' in overview and "/queues/billing" in overview and "<svg" in overview
    assert "workers live, 1 stale" in overview
    job = s.get(f"/jobs/{data.failed_id}").text
    assert (
        '<pre class="traceback">' in job
        and "ValueError: invalid literal for int() with base 10: &#39;12,50&#39;" in job
    )
    assert f"/jobs/{data.failed_id}/retry" in job and f"/jobs/{data.failed_id}/cancel" not in job  # fits the state
    active = s.get(f"/jobs/{data.active_id}").text
    assert 'id="job-progress" value="250" max="1000"' in active and "250/1000 rows" in active
    assert "Request cancellation" in active and "/retry" not in active
    pending = s.get(f"/jobs/{data.pending_id}").text
    assert f"/jobs/{data.pending_id}/cancel" in pending and "/retry" not in pending
    batch = s.get(f"/batches/{data.batch_id}").text
    assert batch.count('class="node"') == 6  # 4 members, the continuation, and the batch itself
    for job_id in data.batch_jobs:
        assert f'href="/jobs/{job_id}"' in batch
    assert 'data-state="succeeded"' in batch and 'Settled <span id="fraction">25%' in batch
    merge = s.get(f"/jobs/{data.batch_jobs[3]}").text
    assert f'href="/jobs/{data.batch_jobs[1]}">job {data.batch_jobs[1]}</a>' in merge  # dependencies as links
    schedules = s.get("/schedules").text
    assert "nightly-report" in schedules and "<time" in schedules and "/schedules/nightly-report/trigger" in schedules
    workers = s.get("/workers").text
    assert workers.count("badge-live") == 1 and workers.count(">stale<") == 1
    assert f'href="/jobs/{data.active_id}">#{data.active_id} export_csv' in workers
    queue = s.get("/queues/emails").text
    assert "tenant-0" in queue and "cap 2 active per group" in queue and "/queues/emails/pause" in queue


def test_job_list_filters_search_and_n_of_m(dsn: str, web: RunningWeb) -> None:
    with pgjobs.Client(dsn) as c:
        for i in range(7):
            c.enqueue("mail", {"to": f"user{i}@example.org"}, queue="q1")
        c.enqueue("report", {"title": "Quarterly"}, queue="q2", unique_key="report-q3")
    s = web.client()
    first = s.get("/jobs?per_page=3").text
    assert _shown(1, 3, 8) in first and "page 1 of 3" in first and 'rel="next"' in first and 'rel="prev"' not in first
    last = s.get("/jobs?per_page=3&page=3").text
    assert _shown(7, 8, 8) in last and 'rel="next"' not in last
    assert '<span id="count">0 of 8</span>' in s.get("/jobs?per_page=3&page=9").text  # past the end: how many
    assert _shown(1, 1, 1) in s.get("/jobs?search=user3@").text  # payload
    assert _shown(1, 1, 1) in s.get("/jobs?search=REPORT-Q").text  # unique key, any case
    assert _shown(1, 7, 7) in s.get("/jobs?kind=mail").text
    assert _shown(1, 1, 1) in s.get("/jobs?queue=q2&state=pending").text
    api = s.get("/api/jobs?queue=q1&limit=2&offset=1").json()
    assert api["total"] == 7 and len(api["jobs"]) == 2


@pytest.mark.parametrize(
    ("path", "status", "says"),
    [
        ("/jobs?state=bogus", 400, "state 'bogus' is not one of"),
        ("/api/jobs?state=bogus", 400, "state 'bogus' is not one of"),
        ("/jobs?per_page=abc", 400, "per_page must be an integer, got 'abc'"),
        ("/jobs?page=0", 400, "page must be between 1"),
        ("/api/jobs?limit=100000", 400, "limit must be between 0 and 1000, got 100000"),
        ("/jobs/abc", 400, "id must be an integer, got 'abc'"),
        ("/api/jobs/99999999999999999999", 400, "id out of range: 99999999999999999999"),
        ("/jobs/424242", 404, "job 424242 not found"),
        ("/api/batches/424242", 404, "batch 424242 not found"),
        ("/queues/nope", 404, "queue 'nope' has no jobs"),
        ("/api/events?job=x", 400, "job must be integers, got 'x'"),
        ("/nowhere", 404, "Not Found"),
    ],
)
def test_bad_parameters_get_a_4xx_naming_them(web: RunningWeb, path: str, status: int, says: str) -> None:
    r = web.client().get(path)
    assert r.status_code == status, r.text
    assert says in (r.json()["error"] if r.headers["content-type"].startswith("application/json") else r.text)


def test_actions_change_what_they_say(dsn: str, web: RunningWeb) -> None:
    data = seed(dsn)
    s = web.client()
    with pgjobs.Client(dsn) as c:
        r = _post(web, s, f"/jobs/{data.failed_id}/retry")
        assert r.status_code == 303 and r.headers["location"].startswith(f"/jobs/{data.failed_id}?notice=")
        assert c.job_status(data.failed_id).state == "pending"  # type: ignore[union-attr]
        assert "queued again" in s.get(r.headers["location"]).text
        r = _post(web, s, f"/jobs/{data.failed_id}/retry")  # no longer failed: PJ004 -> 409 with its message
        assert r.status_code == 409 and "failed or cancelled" in r.text
        mails = [j.id for j in c.list_jobs(queue="emails")]
        r = _post(web, s, "/jobs/bulk", action="cancel", scope="selected", ids=[str(i) for i in mails[:2]])
        assert r.status_code == 303 and "2+of+2+jobs+cancelled" in r.headers["location"]
        assert sorted(j.id for j in c.list_jobs(queue="emails", state="cancelled")) == sorted(mails[:2])
        r = _post(web, s, "/jobs/bulk", action="retry", scope="filter", queue="emails", state="cancelled")
        assert "2+of+2+jobs+queued+again" in r.headers["location"]
        assert c.list_jobs(queue="emails", state="cancelled") == []
        assert _post(web, s, "/jobs/bulk", action="cancel", scope="selected").status_code == 400
        assert _post(web, s, "/jobs/bulk", action="explode", scope="filter").status_code == 400
        _post(web, s, "/queues/emails/pause")
        assert next(q for q in c.queues() if q.queue == "emails").paused
        _post(web, s, "/queues/emails/resume")
        assert not next(q for q in c.queues() if q.queue == "emails").paused
        _post(web, s, "/queues/emails/configure", max_active="5", max_active_per_group="0", max_length="")
        emails = next(q for q in c.queues() if q.queue == "emails")
        assert (emails.max_active, emails.max_active_per_group, emails.fair) == (5, None, True)
        r = _post(web, s, "/queues/emails/configure", max_active="-1")
        assert r.status_code == 400 and "max_active must be >= 0" in r.text
        assert "cap 5" not in s.get("/queues/emails").text and ">5<" in s.get("/queues/emails").text
        _post(web, s, f"/schedules/{data.schedule}/pause")
        assert c.get_schedule(data.schedule).paused  # type: ignore[union-attr]
        _post(web, s, f"/schedules/{data.schedule}/resume")
        assert not c.get_schedule(data.schedule).paused  # type: ignore[union-attr]
        before = len(c.list_jobs(kind="report"))
        r = _post(web, s, f"/schedules/{data.schedule}/trigger")
        assert "enqueued+now" in r.headers["location"] and len(c.list_jobs(kind="report")) == before + 1
        assert _post(web, s, "/schedules/nope/trigger").status_code == 404
        r = _post(web, s, f"/batches/{data.batch_id}/cancel")
        assert r.status_code == 303 and c.batch_status(data.batch_id).state == "cancelled"  # type: ignore[union-attr]


def test_database_down_gives_a_banner_fast_not_a_hang(make_web: Callable[..., RunningWeb]) -> None:
    dead = f"postgresql://postgres@127.0.0.1:{free_port()}/postgres?connect_timeout=1"
    web = make_web(dsn=dead, connect_timeout=1.0)
    s = web.client()
    for path, html in (("/", True), ("/jobs?state=failed", True), ("/api/overview", False), ("/metrics", False)):
        t0 = time.monotonic()
        r = s.get(path, headers={"Accept": "text/html"} if html else {})
        assert time.monotonic() - t0 < 5, path
        assert r.status_code == 503, path
        if html:
            assert 'id="db-banner"' in r.text and "The database is unreachable." in r.text
            assert 'id="db-banner" class="banner" hidden' not in r.text
        elif path == "/metrics":
            assert "database unreachable" in r.text
        else:
            assert r.json()["database"] == "unreachable"
    assert s.get("/jobs?state=bogus").status_code == 400  # parameters are checked before the database


@pytest.mark.smoke
def test_metrics_parse_and_carry_the_gauges(dsn: str, web: RunningWeb) -> None:
    seed(dsn)
    r = web.client(login=False).get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    jobs = {(s.labels["queue"], s.labels["state"]): s.value for s in families["pgjobs_jobs"].samples}
    assert jobs[("billing", "succeeded")] == 4 and jobs[("billing", "failed")] == 1
    assert jobs[("emails", "pending")] == 6 and jobs[("exports", "active")] == 1
    oldest = {s.labels["queue"]: s.value for s in families["pgjobs_oldest_pending_seconds"].samples}
    assert oldest["emails"] > 0 and oldest["billing"] == 0
    workers = {s.labels["status"]: s.value for s in families["pgjobs_workers"].samples}
    assert workers == {"live": 1, "stale": 1}

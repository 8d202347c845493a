"""The pages an operator reads at a glance, against a real database: the queue list, the job list's state
tabs, run durations, progress bars of every counted shape, what a cancel really did, deleting a finished
job (its confirm step, CSRF, read-only), the worker's concurrency, and batch graphs grouped to stay
readable at 100 and 1,000 members."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx
import psycopg
import pytest

import pgjobs
from pgjobs.web.dag import COLUMN_LIMIT, layout
from pgjobs.web.views import progress_parts
from tests.web.seed import seed, seed_big_batch
from tests.web.support import RunningWeb


def _post(web: RunningWeb, s: httpx.Client, path: str, **form: str) -> httpx.Response:
    return s.post(path, data={"csrf_token": web.csrf(), **form}, headers={"Origin": web.url})


def _notice(r: httpx.Response) -> str:
    assert r.status_code == 303, r.text
    return str(httpx.URL(r.headers["location"]).params["notice"])


def test_queues_page_lists_every_queue_with_counts_and_caps(dsn: str, web: RunningWeb) -> None:
    seed(dsn)
    with pgjobs.Client(dsn) as c:
        c.configure_queue("billing", max_active=5, max_length=100)
        c.configure_queue("idle", paused=True)  # settings, no jobs: listed too
    s = web.client()
    for path in ("/", "/jobs", "/workers"):
        assert '<a href="/queues">Queues</a>' in s.get(path).text  # the nav item
    page = s.get("/queues")
    assert page.status_code == 200
    rows = dict(re.findall(r'<tr data-queue="([^"]+)">(.*?)</tr>', page.text, re.S))
    assert sorted(rows) == ["billing", "default", "emails", "etl", "exports", "idle"]
    for name, row in rows.items():
        assert f'<a href="/queues/{name}">{name}</a>' in row  # the existing per-queue page
    assert 'href="/jobs?queue=billing&amp;state=succeeded">4</a>' in rows["billing"]
    assert "max active <b>5</b>" in rows["billing"] and "length <b>0 / 100</b>" in rows["billing"]
    assert "per group <b>2</b>" in rows["emails"] and ">fair<" in rows["emails"]
    assert "badge-paused" in rows["idle"] and "/queues/idle/resume" in rows["idle"]
    assert "none" in rows["exports"] and "/queues/exports/pause" in rows["exports"]
    r = _post(web, s, "/queues/idle/resume", next="/queues")
    assert r.headers["location"].startswith("/queues?") and _notice(r) == "queue idle resumed"


def test_job_list_has_state_tabs_counting_the_filter(dsn: str, web: RunningWeb) -> None:
    with pgjobs.Client(dsn) as c:
        for i in range(5):
            c.enqueue("mail", {"n": i}, queue="q1")
        c.enqueue("mail", {}, queue="q2")
        [job] = c.claim("w", ["q1"])
        c.dead_letter(job.id, job.lease_token, "boom")
    s = web.client()
    text = s.get("/jobs?queue=q1&state=failed").text
    assert '<select name="state">' not in text  # the tabs replace the dropdown
    tabs = dict(re.findall(r'data-state="([a-z]+)">[a-z]+ <span class="tab-n">(\d+)</span>', text))
    assert tabs == {
        "all": "5", "waiting": "0", "scheduled": "0", "pending": "4", "active": "0",
        "succeeded": "0", "failed": "1", "cancelled": "0",
    }  # fmt: skip
    assert re.search(r'class="tab s-failed on" aria-current="page" data-state="failed"', text)
    # each tab keeps the other filters and drops the page
    assert 'href="/jobs?queue=q1&amp;state=pending&amp;per_page=50"' in text
    assert 'href="/jobs?queue=q1&amp;per_page=50" class="tab on"' not in text and 'class="tab" data-state="all"' in text
    assert '<input type="hidden" name="state" value="failed">' in text  # the filter form keeps the tab
    everything = s.get("/jobs").text
    assert re.search(
        r'class="tab on" aria-current="page" data-state="all">all <span class="tab-n">6</span>', everything
    )


def _set_times(dsn: str, job_id: int, sql: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"UPDATE pgjobs.jobs SET {sql} WHERE id = %s", (job_id,))  # test setup: a known run time


def test_run_durations_on_the_job_list_and_the_job_page(dsn: str, web: RunningWeb) -> None:
    with pgjobs.Client(dsn) as c:
        ran = c.enqueue("quick", {})
        [j] = c.claim("w")
        c.complete(j.id, j.lease_token)
        running = c.enqueue("slow", {})
        [r] = c.claim("w")
        retried = c.enqueue("flaky", {})
        for _ in range(2):
            [f] = c.claim("w")
            c.fail(f.id, f.lease_token, "try again", retry_at=datetime.now(UTC))  # due again at once
        [f] = c.claim("w")
        c.complete(f.id, f.lease_token)
    _set_times(dsn, ran.id, "first_started_at = completed_at - interval '2.3 seconds'")
    _set_times(dsn, running.id, "first_started_at = now() - interval '65 seconds'")
    _set_times(dsn, retried.id, "first_started_at = completed_at - interval '3 minutes 5 seconds'")
    s = web.client()
    listing = s.get("/jobs").text
    assert "ran 2.3 s</span>" in listing
    assert re.search(r"running for <time datetime=\"[^\"]+\" data-since>1 min \d+ s</time>", listing)
    assert "took 3 min 5 s over 3 attempts</span>" in listing
    assert "ran 2.3 s" in s.get(f"/jobs/{ran.id}").text
    assert (
        'id="run-time"><span class="run-time" title="since its first start">running for'
        in s.get(f"/jobs/{running.id}").text
    )
    assert r.id == running.id


@pytest.mark.parametrize(
    ("progress", "parts"),
    [
        ({"done": 3, "of": 10}, (3.0, 10.0, "3/10")),
        ({"frame": 12, "of": 300}, (12.0, 300.0, "frame 12/300")),
        ({"pages": 2, "total": 8, "message": "printing"}, (2.0, 8.0, "pages 2/8 printing")),
        ({"done": 250, "total": 1000, "message": "rows"}, (250.0, 1000.0, "250/1000 rows")),
        ({"current": 1.5, "total": 4}, (1.5, 4.0, "1.5/4")),
        ({"done": 2000000, "of": 4000000}, (2e6, 4e6, "2000000/4000000")),
        ({"percent": 40}, (40.0, 100.0, "40%")),
        (0.25, (0.25, 1.0, "25%")),
        ({"a": 1, "b": 2, "of": 3}, None),  # which one counts? none is drawn
        ({"frame": 1, "of": 0}, None),
        ({"frame": True, "of": 3}, None),
        ({"frame": "12", "of": 300}, None),
        ([1, 2], None),
        (True, None),
    ],
)
def test_progress_bar_for_every_counted_shape(progress: Any, parts: tuple[float, float, str] | None) -> None:
    assert progress_parts(progress) == parts


def test_progress_of_frames_is_drawn_on_the_job_page(dsn: str, web: RunningWeb) -> None:
    with pgjobs.Client(dsn) as c:
        job = c.enqueue("render", {})
        [r] = c.claim("w")
        c.progress(r.id, r.lease_token, {"frame": 12, "of": 300})
    page = web.client().get(f"/jobs/{job.id}").text
    assert 'id="job-progress" value="12" max="300"' in page and "frame 12/300" in page
    assert 'value="12" max="300"></progress>' in web.client().get("/jobs").text


def test_cancel_says_what_really_happened(dsn: str, web: RunningWeb) -> None:
    with pgjobs.Client(dsn) as c:
        running = c.enqueue("slow", {})
        [r] = c.claim("w")
        waiting = c.enqueue("later", {})
        s = web.client()
        said = _notice(_post(web, s, f"/jobs/{running.id}/cancel"))
        assert said == f"job {running.id}: cancellation requested (still running: its worker stops it)"
        job = c.job_status(running.id)
        assert job is not None and job.state == "active" and job.cancel_requested
        page = s.get(f"/jobs/{running.id}").text
        assert "cancellation requested</span>" in page and "Request cancellation" not in page
        assert _notice(_post(web, s, f"/jobs/{waiting.id}/cancel")) == f"job {waiting.id}: cancelled"
        assert c.job_status(waiting.id).state == "cancelled"  # type: ignore[union-attr]
        assert "had already ended" in _notice(_post(web, s, f"/jobs/{waiting.id}/cancel"))
        assert r.id == running.id
        # the same for many at once
        busy = c.enqueue("slow", {}, queue="bulk")
        [b] = c.claim("w", ["bulk"])
        idle = [c.enqueue("later", {}, queue="bulk").id for _ in range(2)]
        ids = [str(i) for i in (b.id, *idle)]
        r2 = s.post(
            "/jobs/bulk",
            data={"csrf_token": web.csrf(), "action": "cancel", "scope": "selected", "ids": ids},
            headers={"Origin": web.url},
        )
        assert _notice(r2) == "2 of 3 jobs cancelled, 1 running: cancellation requested (their workers stop them)"
        assert c.job_status(busy.id).state == "active"  # type: ignore[union-attr]


def test_delete_a_finished_job_confirm_csrf_and_state(dsn: str, web: RunningWeb) -> None:
    data = seed(dsn)
    s = web.client()
    job_page = s.get(f"/jobs/{data.failed_id}").text
    assert f'href="/jobs/{data.failed_id}/delete"' in job_page
    assert f"/jobs/{data.active_id}/delete" not in s.get(f"/jobs/{data.active_id}").text  # live: no delete
    confirm = s.get(f"/jobs/{data.failed_id}/delete")
    assert confirm.status_code == 200 and f'action="/jobs/{data.failed_id}/delete"' in confirm.text
    assert f'name="csrf_token" value="{web.csrf()}"' in confirm.text and f"Delete job {data.failed_id}" in confirm.text
    with pgjobs.Client(dsn) as c:
        assert c.job_status(data.failed_id) is not None  # the confirm page changes nothing
        no_csrf = s.post(f"/jobs/{data.failed_id}/delete", headers={"Origin": web.url})
        assert no_csrf.status_code == 403 and "CSRF" in no_csrf.text
        assert c.job_status(data.failed_id) is not None
        r = _post(web, s, f"/jobs/{data.failed_id}/delete")
        assert r.headers["location"].startswith("/jobs?") and _notice(r) == f"job {data.failed_id} deleted"
        assert c.job_status(data.failed_id) is None
        live = _post(web, s, f"/jobs/{data.pending_id}/delete")
        assert live.status_code == 409 and "only terminal jobs can be deleted" in live.text
        assert c.job_status(data.pending_id) is not None
        assert "can be deleted" in s.get(f"/jobs/{data.pending_id}/delete").text  # the page says why not
        assert _post(web, s, f"/jobs/{data.failed_id}/delete").status_code == 404


def test_read_only_dashboard_offers_no_delete(dsn: str, make_web: Callable[..., RunningWeb]) -> None:
    data = seed(dsn)
    web = make_web(read_only=True)
    s = web.client()
    assert "/delete" not in s.get(f"/jobs/{data.failed_id}").text
    assert s.get(f"/jobs/{data.failed_id}/delete").status_code == 403
    assert _post(web, s, f"/jobs/{data.failed_id}/delete").status_code == 403
    with pgjobs.Client(dsn) as c:
        assert c.job_status(data.failed_id) is not None


def test_workers_page_labels_the_concurrency(dsn: str, web: RunningWeb) -> None:
    seed(dsn)
    text = web.client().get("/workers").text
    assert "\u00d78" not in text and ">concurrency 8</small>" in text and ">concurrency 4</small>" in text
    assert 'title="runs up to 8 jobs at once, over all its queues; 1 running now"' in text


def test_batch_graph_groups_siblings_at_100_and_1000_members(dsn: str, web: RunningWeb) -> None:
    s = web.client()
    flat = seed_big_batch(dsn, 100, fan=False)
    page = s.get(f"/batches/{flat}").text
    groups = dict(re.findall(r'class="node group" data-count="(\d+)" data-kind="([a-z]+)"', page))
    assert groups == {"70": "resize", "30": "thumbnail"}
    assert page.count('class="node"') == 2  # the batch and its continuation, as themselves
    assert len(re.findall(r"<tr><td><a href=\"/jobs/", s.get(f"/batches/{flat}?kind=thumbnail").text)) == 30
    fan = seed_big_batch(dsn, 1000, fan=True)
    page = s.get(f"/batches/{fan}").text
    assert re.findall(r'class="node group" data-count="(\d+)" data-kind="([a-z]+)"', page) == [("998", "parse")]
    assert page.count('class="node"') == 4  # fetch, merge, the batch, the continuation
    assert page.count('<path class="edge') == 3  # fetch -> parse x998 -> merge, batch -> notify


def test_a_column_of_many_kinds_keeps_the_biggest_and_groups_the_rest(dsn: str) -> None:
    with pgjobs.Client(dsn) as c:
        b = c.batch()
        for kind in range(30):
            for _ in range(kind + 1):
                b.enqueue(f"kind{kind:02}", {})
        b.submit()
        assert b.batch_id is not None
        graph = c.batch_graph(b.batch_id)
    assert graph is not None
    lay = layout(graph)
    [column] = lay.columns
    assert len(column) == COLUMN_LIMIT and lay.jobs == 465
    counts = {n.data.get("kind"): len(n.ids) for n in column}
    assert counts == {**{f"kind{k:02}": k + 1 for k in range(29, 18, -1)}, None: sum(range(1, 20))}

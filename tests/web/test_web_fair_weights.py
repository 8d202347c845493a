"""The queue page of a fair queue: its groups' weights, its rate limit, and the form that sets a weight
(pgjobs/web/pages.py, pgjobs/web/actions.py, templates/queue.html)."""

from __future__ import annotations

import re
from collections.abc import Callable

import httpx

import pgjobs
from tests.web.support import RunningWeb


def _post(web: RunningWeb, s: httpx.Client, path: str, **form: str) -> httpx.Response:
    return s.post(path, data={"csrf_token": web.csrf(), **form}, headers={"Origin": web.url})


def _weights(page: str) -> dict[str, str]:
    """group -> the text of its weight cell, from the page's groups table."""
    rows = re.findall(r"<tr><td><code>([^<]+)</code></td>\s*<td class=\"n[^\"]*\"[^>]*>([^<]+)</td>", page)
    return dict(rows)


def test_the_queue_page_shows_weights_and_the_rate_limit(dsn: str, web: RunningWeb) -> None:
    with pgjobs.Client(dsn) as c:
        c.configure_queue("reports", fair=True, max_starts=10, per=3600)
        c.configure_group("reports", "tenant-1", 3)
        c.configure_group("reports", "tenant-2", 0.5)
        for group in ("tenant-1", "tenant-2", "tenant-3"):
            c.enqueue("render", {}, queue="reports", group_key=group)
        c.claim("w", ["reports"], max_jobs=1)
        c.enqueue("render", {}, queue="reports", group_key="tenant-4")  # not in the ring until the next claim
    s = web.client()
    page = s.get("/queues/reports").text
    # one start taken of a window of 10 an hour: 9 tokens left
    assert '<td id="rate">10 starts per 1 h; 9 tokens now' in page
    assert ">weight</th>" in page and "2 weighted" in page
    assert _weights(page) == {"tenant-1": "3", "tenant-2": "0.5", "tenant-3": "1", "tenant-4": "&mdash;"}
    assert 'action="/queues/reports/weight"' in page


def test_a_queue_not_fair_has_no_weights_and_no_rate_limit(dsn: str, web: RunningWeb) -> None:
    with pgjobs.Client(dsn) as c:
        c.enqueue("render", {}, queue="plain", group_key="tenant-1")
    page = web.client().get("/queues/plain").text
    assert '<td id="rate">none</td>' in page and ">weight</th>" not in page and "/queues/plain/weight" not in page


def test_the_weight_form_sets_resets_and_refuses(dsn: str, web: RunningWeb) -> None:
    with pgjobs.Client(dsn) as c:
        c.configure_queue("reports", fair=True)
        c.enqueue("render", {}, queue="reports", group_key="tenant-1")
        c.enqueue("render", {}, queue="reports", group_key="tenant-2")
        s = web.client()
        r = _post(web, s, "/queues/reports/weight", group_key="tenant-1", weight="4")
        assert r.status_code == 303 and r.headers["location"].startswith("/queues/reports?notice=")
        assert "group+tenant-1+has+weight+4" in r.headers["location"]
        c.claim("w", ["reports"], max_jobs=1)
        assert {g.group_key: g.weight for g in c.fair_groups("reports")} == {"tenant-1": 4.0, "tenant-2": 1.0}
        assert _weights(s.get("/queues/reports").text)["tenant-2"] == "1"
        r = _post(web, s, "/queues/reports/weight", group_key="tenant-1", weight="1")
        assert "weight+1+%28the+default%29" in r.headers["location"]
        for weight, message in (("0", "weight must be in (0, 1000], got 0"), ("much", "weight must be a number")):
            r = _post(web, s, "/queues/reports/weight", group_key="tenant-1", weight=weight)
            assert r.status_code == 400 and message in r.text, r.text
        r = _post(web, s, "/queues/reports/weight", group_key="", weight="2")
        assert r.status_code == 400 and "group_key" in r.text


def test_read_only_has_no_weight_form(dsn: str, make_web: Callable[..., RunningWeb]) -> None:
    web = make_web(read_only=True)
    with pgjobs.Client(dsn) as c:
        c.configure_queue("reports", fair=True)
        c.enqueue("render", {}, queue="reports", group_key="tenant-1")
    s = web.client()
    assert "/queues/reports/weight" not in s.get("/queues/reports").text
    r = _post(web, s, "/queues/reports/weight", group_key="tenant-1", weight="2")
    assert r.status_code == 403 and "read-only" in r.json()["error"]

"""In Debian's Chromium, the pages that an operator reads at a glance: the queue list, the job list's
state tabs and run durations, the batch graph at 100 and 1,000 members (its page stays short), the
worker's concurrency label, and deleting a finished job through its confirm step. Screenshots go where
test_web_browser.py puts them ($PGJOBS_SCREENSHOTS or a scratch directory)."""

from __future__ import annotations

from typing import Any

import pytest

import pgjobs
from tests.web.seed import Seeded, seed, seed_big_batch
from tests.web.support import RunningWeb
from tests.web.test_web_browser import _fits, _login, _no_script_errors, _shot, browser

__all__ = ["_no_script_errors", "browser"]  # fixtures, shared with test_web_browser.py

MAX_PAGE_HEIGHT = 2000  # px at 1280 x 900, whatever the number of members


@pytest.fixture
def seeded(dsn: str, web: RunningWeb) -> Seeded:
    return seed(dsn)


def _height(page: Any) -> int:
    return int(page.evaluate("document.documentElement.scrollHeight"))


def test_queues_page_and_its_nav_item(browser: Any, web: RunningWeb, seeded: Seeded) -> None:
    with pgjobs.Client(web.config.dsn) as c:
        c.configure_queue("billing", max_active=5, max_length=100)
        c.configure_queue("default", paused=True)
    page = _login(browser, web)
    page.goto(web.url + "/")
    page.click("header nav a:text-is('Queues')")
    page.wait_for_url(f"{web.url}/queues")
    rows = page.locator("#queue-list tbody tr")
    names = [rows.nth(i).get_attribute("data-queue") for i in range(rows.count())]
    assert names == ["billing", "default", "emails", "etl", "exports"]
    emails = page.locator('#queue-list tr[data-queue="emails"]')
    assert "fair" in emails.inner_text() and "6" in emails.inner_text()
    billing = page.locator('#queue-list tr[data-queue="billing"] .caps-cell').inner_text()
    assert "max active 5" in billing and "length 0 / 100" in billing  # its 5 jobs are finished
    assert "paused" in page.locator('#queue-list tr[data-queue="default"]').inner_text()
    assert _fits(page)
    _shot(page, "queues")
    page.click('#queue-list tr[data-queue="default"] button:text-is("Resume")')
    page.wait_for_selector(".notice")
    assert page.url.startswith(f"{web.url}/queues?") and "queue default resumed" in page.inner_text(".notice")
    assert "running" in page.locator('#queue-list tr[data-queue="default"] .badges').inner_text()
    emails.locator("a:text-is('emails')").click()
    page.wait_for_url(f"{web.url}/queues/emails")
    phone = _login(browser, web, 390, 844)
    phone.goto(f"{web.url}/queues")
    assert _fits(phone)
    phone.close()
    page.close()


def test_state_tabs_and_durations_on_the_job_list(browser: Any, web: RunningWeb, seeded: Seeded) -> None:
    page = _login(browser, web)
    tabs = page.locator("#state-tabs a")
    counts = {tabs.nth(i).get_attribute("data-state"): tabs.nth(i).inner_text() for i in range(tabs.count())}
    assert counts["all"] == "all 18" and counts["failed"] == "failed 1" and counts["pending"] == "pending 9"
    assert page.locator("#state-tabs a.on").get_attribute("data-state") == "all"
    assert page.locator("select[name=state]").count() == 0  # the tabs replace the dropdown
    page.click('#state-tabs a[data-state="succeeded"]')
    page.wait_for_selector('#state-tabs a.on[data-state="succeeded"]')
    assert page.locator("#jobs tbody tr").count() == 5
    assert page.locator("#jobs .run-time").first.inner_text().startswith("ran ")
    page.click('#state-tabs a[data-state="active"]')
    page.wait_for_selector('#state-tabs a.on[data-state="active"]')
    assert page.locator("#jobs .run-time").first.inner_text().startswith("running for ")
    page.goto(f"{web.url}/jobs")
    assert _fits(page)
    page.close()


@pytest.mark.parametrize(("members", "fan"), [(100, False), (1000, True)], ids=["100-flat", "1000-fan"])
def test_a_big_batch_page_stays_readable(browser: Any, web: RunningWeb, dsn: str, members: int, fan: bool) -> None:
    batch_id = seed_big_batch(dsn, members, fan)
    page = _login(browser, web)
    page.goto(f"{web.url}/batches/{batch_id}")
    page.wait_for_selector("#live-status.on")
    assert _height(page) < MAX_PAGE_HEIGHT, f"the page is {_height(page)} px tall"
    assert _fits(page)
    groups = page.locator("svg#dag a.node.group")
    boxes = page.locator("svg#dag a.node").count()
    assert 2 <= boxes <= 12
    grouped = sum(int(groups.nth(i).get_attribute("data-count") or 0) for i in range(groups.count()))
    assert grouped >= members - 3  # every member is drawn, the siblings within a group
    box = page.locator("svg#dag").bounding_box()
    assert box is not None and box["height"] < 800
    _shot(page, f"batch-{members}")
    # a group links to the member list of its kind
    kind = "parse" if fan else "resize"
    page.click(f'svg#dag a.node.group[data-kind="{kind}"]')
    page.wait_for_url(f"**/batches/{batch_id}?kind={kind}#members")
    listed = page.locator("#members tbody tr").count()
    assert listed == (members - 2 if fan else members * 7 // 10)
    assert _height(page) < MAX_PAGE_HEIGHT
    page.close()


def test_workers_concurrency_is_labelled(browser: Any, web: RunningWeb, seeded: Seeded) -> None:
    page = _login(browser, web)
    page.goto(f"{web.url}/workers")
    label = page.locator("#workers .concurrency").first
    assert label.inner_text() == "concurrency 8"
    assert "jobs at once" in (label.get_attribute("title") or "")
    page.close()


def test_delete_a_finished_job_through_its_confirm_step(browser: Any, web: RunningWeb, seeded: Seeded) -> None:
    page = _login(browser, web)
    page.goto(f"{web.url}/jobs/{seeded.active_id}")
    assert page.locator("#delete").count() == 0  # running: nothing to delete
    page.goto(f"{web.url}/jobs/{seeded.failed_id}")
    assert "failed" in page.inner_text("#run-time") or "ran" in page.inner_text("#run-time")
    page.click("#delete")
    page.wait_for_url(f"{web.url}/jobs/{seeded.failed_id}/delete")
    _shot(page, "job-delete")
    with pgjobs.Client(web.config.dsn) as c:
        assert c.job_status(seeded.failed_id) is not None  # the confirm page changes nothing
        page.click(f"button:text-is('Delete job {seeded.failed_id}')")
        page.wait_for_selector(".notice")
        assert page.inner_text(".notice") == f"job {seeded.failed_id} deleted"
        assert c.job_status(seeded.failed_id) is None
    page.close()


def test_frame_progress_moves_live_and_cancel_says_requested(browser: Any, web: RunningWeb, dsn: str) -> None:
    with pgjobs.Client(dsn) as c:
        job = c.enqueue("render", {"scene": "intro"})
        [r] = c.claim("w", lease=300)
        c.progress(r.id, r.lease_token, {"frame": 1, "of": 300})
        page = _login(browser, web)
        page.goto(f"{web.url}/jobs/{job.id}")
        page.wait_for_selector("#live-status.on")
        assert page.inner_text("#job-progress-text") == "frame 1/300"
        assert page.inner_text("#run-time").startswith("running for ")
        page.evaluate("window.__marker = 42")
        c.progress(r.id, r.lease_token, {"frame": 150, "of": 300})  # drawn by app.js, no reload
        page.wait_for_selector('#job-progress[value="150"][max="300"]')
        assert page.inner_text("#job-progress-text") == "frame 150/300"
        assert page.evaluate("window.__marker") == 42
        page.click("button:text-is('Request cancellation')")
        page.wait_for_selector(".notice")
        assert "cancellation requested" in page.inner_text(".notice")
        assert page.get_attribute("#job-state", "data-state") == "active"
    page.close()

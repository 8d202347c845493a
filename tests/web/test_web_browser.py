"""End to end in Debian's Chromium (headless, driven by playwright's Python package; no browser download):
login, every page and action, CSRF and cross-site refusals, the DAG drawing, a live progress bar moving
without a reload, the traceback of a failed job as text, layouts at 1280 px and on a phone. The screenshots
go to a scratch directory, or to $PGJOBS_SCREENSHOTS (docs/screenshots/ for the README's)."""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import pgjobs
from tests.web.seed import Seeded, seed
from tests.web.support import TOKEN, RunningWeb, free_port

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
# The README's screenshots are refreshed on request (PGJOBS_SCREENSHOTS=docs/screenshots pytest tests/web);
# otherwise every run would rewrite tracked files. By default they go to a scratch directory.
SHOTS = Path(os.environ.get("PGJOBS_SCREENSHOTS") or Path(tempfile.gettempdir()) / "pgjobs-screenshots")

if not os.path.exists(CHROMIUM):
    pytest.skip(
        f"{CHROMIUM} is absent: apt-get install chromium (the browser tests drive Debian's Chromium)",
        allow_module_level=True,
    )
sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the Python package only)")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield b
        finally:
            b.close()


JS_ERRORS: list[str] = []


def _watch(page: Any) -> None:
    """Uncaught script errors and CSP refusals fail the test (checked in the browser fixture's teardown)."""
    page.on("pageerror", lambda exc: JS_ERRORS.append(f"{page.url}: {exc}"))
    page.on(
        "console",
        lambda m: (
            JS_ERRORS.append(f"{page.url}: {m.text}")
            if m.type == "error" and ("Content Security Policy" in m.text or "Refused" in m.text)
            else None
        ),
    )


@pytest.fixture(autouse=True)
def _no_script_errors() -> Iterator[None]:
    JS_ERRORS.clear()
    yield
    assert JS_ERRORS == []


def _login(browser: Any, web: RunningWeb, width: int = 1280, height: int = 900) -> Any:
    page = browser.new_page(viewport={"width": width, "height": height})
    _watch(page)
    page.set_default_timeout(15000)
    page.goto(f"{web.url}/jobs")
    assert "/login" in page.url
    page.fill("input[name=token]", "wrong")
    page.click("button")
    assert page.inner_text(".error-message") == "wrong token"
    page.fill("input[name=token]", TOKEN)
    page.click("button")
    page.wait_for_url(f"{web.url}/jobs")
    return page


def _shot(page: Any, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def _fits(page: Any) -> bool:
    return bool(page.evaluate("document.documentElement.scrollWidth <= window.innerWidth"))


@pytest.fixture
def seeded(dsn: str, web: RunningWeb) -> Seeded:
    return seed(dsn)


def test_every_page_renders_and_fits(browser: Any, web: RunningWeb, seeded: Seeded) -> None:
    page = _login(browser, web)
    pages = {
        "overview": "/",
        "jobs": "/jobs",
        "job-failed": f"/jobs/{seeded.failed_id}",
        "batch": f"/batches/{seeded.batch_id}",
        "queue": "/queues/emails",
        "schedules": "/schedules",
        "workers": "/workers",
    }
    for name, path in pages.items():
        page.goto(web.url + path)
        page.wait_for_selector("#live-status.on")  # the live stream is connected
        assert _fits(page), f"{path} is wider than 1280 px"
        _shot(page, name)
    phone = _login(browser, web, 390, 844)
    for path in pages.values():
        phone.goto(web.url + path)
        assert _fits(phone), f"{path} is wider than a phone"
    phone.goto(web.url + "/")
    _shot(phone, "phone-overview")
    phone.close()
    page.close()


def test_failed_job_shows_its_traceback_as_text(browser: Any, web: RunningWeb, seeded: Seeded) -> None:
    page = _login(browser, web)
    page.goto(f"{web.url}/jobs/{seeded.failed_id}")
    text = page.inner_text("pre.traceback")
    assert text.strip() == seeded.traceback_text.strip()
    assert "ValueError: invalid literal for int() with base 10: '12,50'" in text
    assert page.locator("#timeline li").count() >= 3
    page.close()


def test_batch_page_draws_the_graph_with_states(browser: Any, web: RunningWeb, seeded: Seeded) -> None:
    page = _login(browser, web)
    page.goto(f"{web.url}/batches/{seeded.batch_id}")
    nodes = page.locator("svg#dag a.node")
    assert nodes.count() == 6
    states = {nodes.nth(i).get_attribute("data-id"): nodes.nth(i).get_attribute("data-state") for i in range(6)}
    fetch, parse_a, _, merge = seeded.batch_jobs
    assert states[str(fetch)] == "succeeded" and states[str(parse_a)] == "pending" and states[str(merge)] == "waiting"
    assert page.locator("svg#dag path.edge").count() == 5
    box = page.locator("svg#dag").bounding_box()
    assert box is not None and box["width"] > 300 and box["height"] > 100
    # live: the graph redraws when a member changes, without a reload
    page.evaluate("window.__marker = 42")
    with pgjobs.Client(web.config.dsn) as c:
        [job] = c.claim("w", ["etl"])
        c.complete(job.id, job.lease_token)
    # (selectors, not wait_for_function: the CSP forbids the eval that the latter needs)
    page.wait_for_selector(f'svg#dag a.node[data-id="{job.id}"][data-state="succeeded"]')
    assert page.evaluate("window.__marker") == 42
    page.close()


def test_a_running_jobs_progress_bar_moves_without_reload(browser: Any, web: RunningWeb, seeded: Seeded) -> None:
    page = _login(browser, web)
    page.goto(f"{web.url}/jobs/{seeded.active_id}")
    page.wait_for_selector("#live-status.on")
    assert page.get_attribute("#job-progress", "value") == "250"
    page.evaluate("window.__marker = 42")
    with pgjobs.Client(web.config.dsn) as c:
        for done in (500, 750):
            c.progress(seeded.active_id, seeded.active_token, {"done": done, "total": 1000, "message": "rows"})  # type: ignore[arg-type]
            page.wait_for_selector(f'#job-progress[value="{done}"]')
            assert page.inner_text("#job-progress-text") == f"{done}/1000 rows"
    assert page.evaluate("window.__marker") == 42  # the same document: no reload
    _shot(page, "job-running")
    page.close()


def test_actions_through_the_ui(browser: Any, web: RunningWeb, seeded: Seeded) -> None:
    page = _login(browser, web)
    page.goto(f"{web.url}/jobs/{seeded.failed_id}")
    page.click("main button:text-is('Retry')")
    page.wait_for_selector(".notice")
    assert "queued again" in page.inner_text(".notice")
    assert page.get_attribute("#job-state", "data-state") == "pending"
    page.goto(f"{web.url}/jobs?queue=emails")
    page.check("#select-all")
    page.click("button[value=cancel]")
    page.wait_for_selector(".notice")
    assert "6 of 6 jobs cancelled" in page.inner_text(".notice")
    page.goto(f"{web.url}/schedules")
    page.click("button:text-is('Run now')")
    assert "enqueued now" in page.inner_text(".notice")
    page.goto(f"{web.url}/queues/emails")
    page.click("button:text-is('Pause')")
    assert "paused" in page.inner_text(".notice") and page.locator("button:text-is('Resume')").count() == 1
    page.close()


def _attacker_site(html: str) -> tuple[str, Callable[[], None]]:
    """Another origin (its own port) serving one page: a site the dashboard's user happens to visit."""
    body = html.encode()

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    def stop() -> None:
        server.shutdown()
        server.server_close()

    return f"http://127.0.0.1:{server.server_address[1]}/", stop


def test_csrf_and_cross_site_posts_are_refused_in_the_browser(browser: Any, web: RunningWeb, seeded: Seeded) -> None:
    page = _login(browser, web)
    page.goto(f"{web.url}/jobs/{seeded.pending_id}")
    # same origin, but no CSRF token: refused
    status = page.evaluate(f"fetch('/jobs/{seeded.pending_id}/cancel', {{method: 'POST'}}).then(r => r.status)")
    assert status == 403
    # another site posts a form to the dashboard, even with the right CSRF token (as if it had leaked)
    action = f"{web.url}/jobs/{seeded.pending_id}/cancel"
    url, stop = _attacker_site(
        f'<form id="f" method="post" action="{action}"><input name="csrf_token" value="{web.csrf()}"></form>'
        "<script>document.getElementById('f').submit()</script>"
    )
    try:
        with page.expect_navigation(url=action):
            page.goto(url)
        assert "refused" in page.content() or "authentication required" in page.content()
    finally:
        stop()
    with pgjobs.Client(web.config.dsn) as c:
        assert c.job_status(seeded.pending_id).state == "pending"  # type: ignore[union-attr]
    page.close()


def test_database_down_banner(browser: Any, make_web: Callable[..., RunningWeb]) -> None:
    web = make_web(dsn=f"postgresql://postgres@127.0.0.1:{free_port()}/postgres", connect_timeout=1.0)
    page = _login(browser, web)
    page.goto(f"{web.url}/")
    assert page.is_visible("#db-banner")
    assert "The database is unreachable." in page.inner_text("#db-banner")
    _shot(page, "database-down")
    page.close()

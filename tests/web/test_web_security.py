"""Safe by default: token for every page and API call, login cookie, CSRF + same-origin for actions, the Host
allow-list, read-only mode, security headers, and no lease token anywhere."""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest

import pgjobs
from pgjobs.cli.main import main
from pgjobs.web.config import WebConfig, check_bind
from tests.web.seed import seed
from tests.web.support import TOKEN, RunningWeb

PAGES = ["/", "/jobs", "/jobs/1", "/batches/1", "/schedules", "/workers", "/queues/default"]
API = ["/api/overview", "/api/jobs", "/api/jobs/1", "/api/batches/1", "/api/workers", "/api/events", "/metrics"]


@pytest.mark.smoke
def test_every_page_and_api_call_needs_the_token(dsn: str, web: RunningWeb) -> None:
    with pgjobs.Client(dsn) as c:
        c.enqueue("ping", {})
    anon = web.client(login=False)
    for path in PAGES:
        r = anon.get(path, headers={"Accept": "text/html"})
        assert r.status_code == 303 and r.headers["location"].startswith("/login?next="), path
    for path in API + PAGES:
        r = anon.get(path)
        assert r.status_code == 401, path
        assert "authentication required" in r.json()["error"]
    assert anon.get("/api/jobs", headers={"Authorization": "Bearer wrong"}).status_code == 401
    bearer = anon.get("/api/jobs", headers={"Authorization": f"Bearer {TOKEN}"})
    assert bearer.status_code == 200 and bearer.json()["total"] == 1
    # the login page and the stylesheet are open; nothing else
    assert anon.get("/login").status_code == 200
    assert anon.get("/static/app.css").status_code == 200


def test_login_sets_an_httponly_samesite_strict_cookie(web: RunningWeb) -> None:
    anon = web.client(login=False)
    wrong = anon.post("/login", data={"token": "nope"}, headers={"Origin": web.url})
    assert wrong.status_code == 401 and "wrong token" in wrong.text
    assert "set-cookie" not in wrong.headers
    r = anon.post("/login", data={"token": TOKEN, "next": "/jobs"}, headers={"Origin": web.url})
    assert r.status_code == 303 and r.headers["location"] == "/jobs"
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
    assert TOKEN not in cookie  # the cookie is derived from the token, not the token itself
    assert anon.get("/api/jobs").status_code == 200
    # an open redirect through ?next= is not possible
    r = anon.post("/login", data={"token": TOKEN, "next": "//evil.example/x"}, headers={"Origin": web.url})
    assert r.headers["location"] == "/"
    # logging in from another site is refused too
    assert anon.post("/login", data={"token": TOKEN}, headers={"Origin": "http://evil.example"}).status_code == 403


def test_cross_site_and_csrf_less_posts_are_refused(dsn: str, web: RunningWeb) -> None:
    with pgjobs.Client(dsn) as c:
        job = c.enqueue("ping", {})
        s = web.client()
        path = f"/jobs/{job.id}/cancel"
        ok_csrf = {"csrf_token": web.csrf()}
        refused = [
            ({"Origin": "http://evil.example"}, ok_csrf, "cross-origin"),
            ({"Sec-Fetch-Site": "cross-site", "Origin": web.url}, ok_csrf, "cross-site"),
            ({"Sec-Fetch-Site": "same-site"}, ok_csrf, "cross-site"),
            ({}, ok_csrf, "neither Origin nor Sec-Fetch-Site"),
            ({"Origin": web.url}, {}, "CSRF"),
            ({"Origin": web.url}, {"csrf_token": "forged"}, "CSRF"),
        ]
        for headers, form, why in refused:
            r = s.post(path, data=form, headers=headers)
            assert r.status_code == 403, (headers, form)
            assert why in r.json()["error"]
            assert c.job_status(job.id).state == "pending"  # type: ignore[union-attr]
        r = s.post(path, data=ok_csrf, headers={"Origin": web.url, "Sec-Fetch-Site": "same-origin"})
        assert r.status_code == 303 and "cancelled" in r.headers["location"]
        assert c.job_status(job.id).state == "cancelled"  # type: ignore[union-attr]
        # a Bearer call carries no ambient credential: no CSRF token or Origin needed
        anon = web.client(login=False)
        r = anon.post(
            f"/jobs/{job.id}/retry", headers={"Authorization": f"Bearer {TOKEN}", "Accept": "application/json"}
        )
        assert r.status_code == 200 and r.json()["ok"] is True
        assert c.job_status(job.id).state == "pending"  # type: ignore[union-attr]


def test_wrong_host_is_refused(make_web: Callable[..., RunningWeb]) -> None:
    web = make_web(allowed_hosts=["jobs.internal"])
    s = web.client()
    for host in ("evil.example", "evil.example:8080", "127.0.0.2"):
        r = s.get("/api/jobs", headers={"Host": host, "Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 400 and "is not allowed" in r.json()["error"], host
    for host in ("jobs.internal", "localhost", f"127.0.0.1:{web.config.port}"):
        assert s.get("/api/jobs", headers={"Host": host}).status_code == 200, host


def test_read_only_hides_and_refuses_every_action(dsn: str, make_web: Callable[..., RunningWeb]) -> None:
    web = make_web(read_only=True)
    with pgjobs.Client(dsn) as c:
        failed = c.enqueue("ping", {}, max_attempts=1)
        [claimed] = c.claim("w")
        c.fail(claimed.id, claimed.lease_token, "boom")
        c.add_schedule("nightly", "ping", "0 3 * * *")
        s = web.client()
        page = s.get(f"/jobs/{failed.id}").text
        assert "read-only" in page and f"/jobs/{failed.id}/retry" not in page
        assert "/trigger" not in s.get("/schedules").text and "/pause" not in s.get("/schedules").text
        assert 'name="ids"' not in s.get("/jobs").text
        headers = {"Origin": web.url}
        for path in (f"/jobs/{failed.id}/retry", "/schedules/nightly/trigger", "/queues/default/pause", "/jobs/bulk"):
            r = s.post(path, data={"csrf_token": web.csrf(), "action": "retry", "scope": "filter"}, headers=headers)
            assert r.status_code == 403 and "read-only" in r.json()["error"], path
        assert c.job_status(failed.id).state == "failed"  # type: ignore[union-attr]
        assert len(c.list_jobs()) == 1


def test_security_headers_on_pages_errors_and_login(web: RunningWeb) -> None:
    s = web.client()
    for r in (s.get("/"), s.get("/jobs?state=bogus"), web.client(login=False).get("/login"), s.get("/api/jobs/x")):
        csp = r.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "unsafe-inline" not in csp
        assert r.headers["x-content-type-options"] == "nosniff"
        assert r.headers["x-frame-options"] == "DENY"
        assert r.headers["referrer-policy"] == "same-origin"
    assert "<script>" not in s.get("/").text  # no inline script: the CSP would block it


def test_no_lease_token_on_any_page_or_api(dsn: str, web: RunningWeb) -> None:
    with pgjobs.Client(dsn) as c:
        c.enqueue("export", {})
        [job] = c.claim("w", lease=300)
        c.progress(job.id, job.lease_token, {"done": 1, "total": 4})
    s = web.client()
    token = str(job.lease_token)
    for path in (f"/jobs/{job.id}", f"/api/jobs/{job.id}", "/jobs", "/api/jobs", "/workers", "/api/workers", "/"):
        body = s.get(path).text
        assert token not in body and "lease_token" not in body, path


def test_binding_beyond_loopback_needs_an_explicit_token(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert check_bind(WebConfig(dsn=dsn, host="0.0.0.0")) is not None
    assert check_bind(WebConfig(dsn=dsn, host="0.0.0.0", token="chosen")) is None
    assert check_bind(WebConfig(dsn=dsn, host="127.0.0.1")) is None
    assert check_bind(WebConfig(dsn=dsn, host="::1")) is None
    assert main(["--dsn", dsn, "web", "--host", "0.0.0.0", "--port", "1"]) == 2
    assert "without an explicit token" in capsys.readouterr().err


def test_pages_work_as_pgjobs_reader_and_actions_as_pgjobs_admin(dsn: str, make_web: Callable[..., RunningWeb]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        granted = conn.execute(
            "SELECT bool_and(r.oid IS NOT NULL AND has_schema_privilege(r.oid, 'pgjobs', 'USAGE'))"
            " FROM (VALUES ('pgjobs_reader'), ('pgjobs_admin')) AS v(name)"
            " LEFT JOIN pg_roles AS r ON r.rolname = v.name"
        ).fetchone()
    if not (granted and granted[0]):
        pytest.skip("this schema grants nothing to pgjobs_reader / pgjobs_admin (the roles of pgjobs migrate)")
    data = seed(dsn)
    web = make_web(role="pgjobs_reader", admin_role="pgjobs_admin")
    s = web.client()
    for path in ("/", "/jobs", f"/jobs/{data.failed_id}", f"/batches/{data.batch_id}", "/schedules", "/workers",
                 "/queues/emails", "/metrics", "/api/overview"):  # fmt: skip
        assert s.get(path).status_code == 200, path
    r = s.post(f"/jobs/{data.failed_id}/retry", data={"csrf_token": web.csrf()}, headers={"Origin": web.url})
    assert r.status_code == 303
    with pgjobs.Client(dsn) as c:
        assert c.job_status(data.failed_id).state == "pending"  # type: ignore[union-attr]
    # the reader role alone cannot act: an action on the reader pool is refused by the database
    with psycopg.connect(dsn, autocommit=True, options="-c role=pgjobs_reader") as conn, pytest.raises(psycopg.Error):
        conn.execute("SELECT pgjobs.dashboard_bulk('cancel', ARRAY[%s]::bigint[])", (data.pending_id,))

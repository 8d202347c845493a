"""``pgjobs web``: a small read-mostly dashboard over the SQL functions, with a live status stream.

Standard library HTTP server, no framework, no JavaScript build. Every page and endpoint is one
client call; the live view is Server-Sent Events of ``read_events``, woken by ``LISTEN pgjobs_status``. It binds to
127.0.0.1 by default and has no authentication of its own: put it behind your own proxy and auth
before exposing it anywhere.

Endpoints: ``/`` (HTML), ``/api/stats``, ``/api/queues``, ``/api/workers``,
``/api/jobs?state=&queue=&kind=&search=&limit=&offset=``, ``/api/jobs/<id>``,
``/api/events`` (SSE), ``POST /api/jobs/<id>/cancel``, ``POST /api/jobs/<id>/retry``.
"""

from __future__ import annotations

import argparse
import json
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import psycopg

from pgjobs.client import Client
from pgjobs.errors import PgJobsError
from pgjobs.jsonable import to_jsonable


def to_json(value: Any) -> bytes:
    return json.dumps(_public(to_jsonable(value))).encode()


def _public(value: Any) -> Any:
    """``value`` without ``lease_token``: the token is the running attempt's credential (whoever has it can
    complete, fail or release the job), so the dashboard never hands it out."""
    if isinstance(value, dict):
        return {k: _public(v) for k, v in value.items() if k != "lease_token"}
    if isinstance(value, list):
        return [_public(v) for v in value]
    return value


class Dashboard:
    """The dashboard's state: a client, the DSN for LISTEN connections, and a stop flag for SSE streams."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.client = Client(dsn, max_size=4)
        self.stopping = threading.Event()

    def close(self) -> None:
        self.stopping.set()
        self.client.close()


class _Handler(BaseHTTPRequestHandler):
    dashboard: Dashboard
    server_version = "pgjobs-web"

    def log_message(self, format: str, *args: Any) -> None:  # quiet by default
        return

    # -- plumbing --------------------------------------------------------------------------------
    def _send(self, status: HTTPStatus, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: HTTPStatus, message: str) -> None:
        self._send(status, to_json({"error": message}))

    def _job_id(self, part: str) -> int | None:
        try:
            return int(part)
        except ValueError:
            self._error(HTTPStatus.BAD_REQUEST, f"job id must be an integer, got {part!r}")
            return None

    # -- routes ----------------------------------------------------------------------------------
    def do_GET(self) -> None:
        url = urlsplit(self.path)
        parts = [p for p in url.path.split("/") if p]
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        client = self.dashboard.client
        try:
            if not parts:
                self._send(HTTPStatus.OK, PAGE.encode(), "text/html; charset=utf-8")
            elif parts == ["api", "stats"]:
                self._send(HTTPStatus.OK, to_json(client.stats()))
            elif parts == ["api", "queues"]:
                self._send(HTTPStatus.OK, to_json(client.queues()))
            elif parts == ["api", "workers"]:
                self._send(HTTPStatus.OK, to_json(client.list_workers()))
            elif parts == ["api", "jobs"]:
                jobs = client.list_jobs(
                    state=query.get("state") or None,
                    queue=query.get("queue") or None,
                    kind=query.get("kind") or None,
                    search=query.get("search") or None,
                    max_rows=int(query.get("limit", "50")),
                    skip_rows=int(query.get("offset", "0")),
                )
                self._send(HTTPStatus.OK, to_json(jobs))
            elif len(parts) == 3 and parts[:2] == ["api", "jobs"]:
                job_id = self._job_id(parts[2])
                if job_id is None:
                    return
                status = client.job_status(job_id)
                if status is None:
                    self._error(HTTPStatus.NOT_FOUND, f"job {job_id} not found")
                else:
                    self._send(HTTPStatus.OK, to_json(status))
            elif parts == ["api", "events"]:
                self._stream_events()
            else:
                self._error(HTTPStatus.NOT_FOUND, f"no such page: {url.path}")
        except ValueError as exc:
            self._error(HTTPStatus.BAD_REQUEST, str(exc))
        except PgJobsError as exc:
            self._error(HTTPStatus.BAD_REQUEST, str(exc))

    def do_POST(self) -> None:
        parts = [p for p in urlsplit(self.path).path.split("/") if p]
        if len(parts) != 4 or parts[:2] != ["api", "jobs"] or parts[3] not in ("cancel", "retry"):
            self._error(HTTPStatus.NOT_FOUND, f"no such action: {self.path}")
            return
        job_id = self._job_id(parts[2])
        if job_id is None:
            return
        client = self.dashboard.client
        try:
            done = client.cancel(job_id) if parts[3] == "cancel" else client.retry(job_id)
        except PgJobsError as exc:
            status = HTTPStatus.NOT_FOUND if exc.sqlstate == "PJ003" else HTTPStatus.CONFLICT
            self._error(status, str(exc))
            return
        self._send(HTTPStatus.OK, to_json({"id": job_id, "action": parts[3], "done": done}))

    def _stream_events(self) -> None:
        """Server-Sent Events: every status event ({"id","state","queue","kind","attempt","batch_id"}) from the
        event log (read_events), read on each pgjobs_status hint and every second, until the client leaves."""
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        client = self.dashboard.client
        keys = ("id", "state", "queue", "kind", "attempt", "batch_id")
        try:
            with psycopg.connect(self.dashboard.dsn, autocommit=True) as conn:
                conn.execute("LISTEN pgjobs_status")
                cursor = client.stream_head()
                self.wfile.write(b": listening\n\n")
                self.wfile.flush()
                quiet, wait = 0.0, 1.0
                while not self.dashboard.stopping.is_set():
                    # After a read that found events no hint comes (the follower reads again by itself): 5 ms.
                    for _ in conn.notifies(timeout=wait, stop_after=1):
                        pass
                    events = client.read_events(after_id=cursor)
                    for ev in events:
                        cursor = ev.event_id or cursor
                        data = {k: getattr(ev, k) for k in keys} | {"state": ev.state.value}
                        self.wfile.write(b"data: " + json.dumps(data).encode() + b"\n\n")
                    quiet, wait = (0.0, 0.005) if events else (quiet + wait, 1.0)
                    if quiet >= 15.0:  # keep-alive, and notices a client that went away
                        quiet = 0.0
                        self.wfile.write(b": ping\n\n")
                    self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            return


def serve(dsn: str, host: str = "127.0.0.1", port: int = 8080) -> ThreadingHTTPServer:
    """A ready (not yet serving) dashboard server; call ``serve_forever()`` then ``shutdown()``."""
    dashboard = Dashboard(dsn)
    handler = type("Handler", (_Handler,), {"dashboard": dashboard})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    original_close = server.server_close

    def server_close() -> None:
        dashboard.close()
        original_close()

    server.server_close = server_close  # type: ignore[method-assign]
    return server


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("web", help="serve the dashboard (read-mostly; binds 127.0.0.1 by default)")
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to bind (127.0.0.1; the dashboard has no authentication)"
    )
    parser.add_argument("--port", type=int, default=8080, help="TCP port (8080; 0 picks a free one)")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    server = serve(args.dsn, args.host, args.port)
    print(f"pgjobs dashboard on http://{args.host}:{server.server_address[1]}/  (Ctrl-C to stop)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>pgjobs</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
 body{font:14px/1.4 system-ui,sans-serif;margin:0;background:#f6f7f9;color:#1d2330}
 header{background:#1d2330;color:#fff;padding:10px 20px;display:flex;gap:16px;align-items:baseline}
 header h1{font-size:18px;margin:0} header span{opacity:.7}
 main{display:grid;grid-template-columns:1fr 1fr;gap:16px;padding:16px 20px}
 section{background:#fff;border-radius:8px;padding:12px 16px;box-shadow:0 1px 2px #0001}
 section.wide{grid-column:1/3} h2{font-size:15px;margin:0 0 8px}
 table{border-collapse:collapse;width:100%} td,th{padding:4px 8px;border-bottom:1px solid #eee;text-align:left}
 th{font-weight:600;color:#555} .n{text-align:right;font-variant-numeric:tabular-nums}
 .s-succeeded{color:#17803d}.s-failed{color:#c0262d}.s-cancelled{color:#888}.s-active{color:#1f5fd1}
 .s-pending{color:#b36b00}.s-scheduled,.s-waiting{color:#6b5bd1}
 #events{font:12px ui-monospace,monospace;height:220px;overflow:auto;white-space:pre}
 button{font-size:12px} input,select{font-size:13px}
 pre{white-space:pre-wrap;word-break:break-word;font-size:12px;background:#f6f7f9;padding:8px}
</style></head><body>
<header><h1>pgjobs</h1><span id="updated"></span></header>
<main>
<section><h2>Queues</h2><table id="stats"></table></section>
<section><h2>Workers</h2><table id="workers"></table></section>
<section class="wide"><h2>Jobs</h2>
 <form id="filter">state <select name="state"><option value="">any</option>
 <option>waiting</option><option>scheduled</option><option>pending</option><option>active</option>
 <option>succeeded</option><option>failed</option><option>cancelled</option></select>
 queue <input name="queue" size="10"> search <input name="search" size="16"> <button>filter</button></form>
 <table id="jobs"></table></section>
<section><h2>Job</h2><div id="job">click a job id</div></section>
<section><h2>Live status events</h2><div id="events"></div></section>
</main>
<script>
const $ = (id) => document.getElementById(id);
const esc = (s) => String(s ?? "").replace(/[&<>"]/g, (c) => ({"&":"&amp;","<":"&lt;",">":"&gt;",'"':"&quot;"}[c]));
async function get(path) { const r = await fetch(path); return r.json(); }
function row(cells, tag="td") { return "<tr>" + cells.map((c) => `<${tag}>${c}</${tag}>`).join("") + "</tr>"; }
async function refresh() {
  const stats = await get("/api/stats");
  const byQueue = {};
  for (const s of stats) { (byQueue[s.queue] ??= {})[s.state] = s.jobs; }
  const states = ["waiting","scheduled","pending","active","succeeded","failed","cancelled"];
  $("stats").innerHTML = row(["queue", ...states], "th") + Object.entries(byQueue).map(([q, c]) =>
    row([esc(q), ...states.map((s) => `<span class="n s-${s}">${c[s] ?? ""}</span>`)])).join("");
  const workers = await get("/api/workers");
  $("workers").innerHTML = row(["worker","last seen","active"], "th") + workers.map((w) =>
    row([esc(w.id), esc(w.last_seen), `<span class="n">${w.active_jobs}</span>`])).join("");
  const params = new URLSearchParams(new FormData($("filter")));
  const jobs = await get("/api/jobs?limit=50&" + params);
  $("jobs").innerHTML = row(["id","kind","queue","state","attempt","run at","last error"], "th") + jobs.map((j) =>
    row([`<a href="#" onclick="show(${j.id});return false">${j.id}</a>`, esc(j.kind), esc(j.queue),
         `<span class="s-${j.state}">${j.state}</span>`, `${j.attempt}/${j.max_attempts}`, esc(j.run_at),
         esc((j.last_error || "").slice(0, 80))])).join("");
  $("updated").textContent = "updated " + new Date().toLocaleTimeString();
}
async function act(id, action) {
  const r = await fetch(`/api/jobs/${id}/${action}`, {method: "POST"});
  const body = await r.json(); if (!r.ok) alert(body.error); show(id); refresh();
}
async function show(id) {
  const j = await get(`/api/jobs/${id}`);
  if (j.error) { $("job").textContent = j.error; return; }
  $("job").innerHTML = `<b>#${j.id} ${esc(j.kind)}</b> <span class="s-${j.state}">${j.state}</span>
    <button onclick="act(${j.id},'cancel')">cancel</button> <button onclick="act(${j.id},'retry')">retry</button>
    <pre>${esc(JSON.stringify(j, null, 2))}</pre>`;
}
$("filter").addEventListener("submit", (e) => { e.preventDefault(); refresh(); });
const events = new EventSource("/api/events");
events.onmessage = (e) => {
  const box = $("events");
  box.textContent = (new Date().toLocaleTimeString() + " " + e.data + "\\n" + box.textContent).slice(0, 20000);
};
refresh(); setInterval(refresh, 3000);
</script></body></html>
"""

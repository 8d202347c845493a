"""Telemetry: worker presence (deregister, live/stale), log lines, Prometheus metrics and
OpenTelemetry traces, against a real PostgreSQL; spans through the SDK's in-memory exporter."""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

import pgjobs
from pgjobs import App, AsyncClient, Client, JobState, Retry, Worker
from pgjobs.runtime.logs import Outage, configure_logging

REPO = Path(__file__).resolve().parents[2]
Body = Callable[[Worker, AsyncClient], Awaitable[None]]


def run_worker(app: App, dsn: str, body: Body, *, client_dsn: str | None = None, **kwargs: Any) -> Worker:
    """Runs ``body(worker, client)`` while a Worker runs, then stops it gracefully and waits for its end."""
    kwargs.setdefault("scheduler", False)
    kwargs.setdefault("poll_interval", 0.5)
    kwargs.setdefault("heartbeat_interval", 1.0)
    worker = Worker(app, dsn, **kwargs)

    async def main() -> None:
        client = AsyncClient(client_dsn or dsn, prepare=kwargs.get("prepare", True))
        async with client, anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            with anyio.fail_after(15):
                while not worker.started.is_set():
                    await anyio.sleep(0.01)
            try:
                with anyio.fail_after(60):
                    await body(worker, client)
            finally:
                worker.stop()

    anyio.run(main)
    return worker


async def wait_state(client: AsyncClient, job_id: int, *states: JobState, timeout: float = 20) -> pgjobs.JobStatus:
    with anyio.fail_after(timeout):
        while True:
            st = await client.job_status(job_id)
            if st is not None and st.state in states:
                return st
            await anyio.sleep(0.02)


# ------------------------------------------------------------------------------------------ presence (SQL)


def test_deregister_worker_removes_it_and_frees_its_jobs(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT pgjobs.worker_heartbeat('w1', '{}')")
    job = conn.execute("SELECT id FROM pgjobs.enqueue('k')").fetchone()
    assert job is not None
    conn.execute("SELECT * FROM pgjobs.claim('w1', '{default}', 1, '1 hour')")
    conn.execute("LISTEN pgjobs_wake")
    assert conn.execute("SELECT pgjobs.deregister_worker(worker => 'w1')").fetchone() == (True,)
    assert conn.execute("SELECT count(*) FROM pgjobs.workers WHERE id = 'w1'").fetchone() == (0,)
    # its job is claimable now (lease expired), not in an hour; the token stays until another claim
    row = conn.execute(
        "SELECT state::text, lease_expires_at <= now(), lease_token IS NOT NULL FROM pgjobs.jobs"
    ).fetchone()
    assert row == ("active", True, True)
    assert [n.payload for n in conn.notifies(timeout=1, stop_after=1)] == ["default"]
    taken = conn.execute("SELECT id, attempt FROM pgjobs.claim('w2', '{default}', 1)").fetchall()
    assert taken == [(job[0], 2)]
    # unknown worker: nothing to do, not an error
    assert conn.execute("SELECT pgjobs.deregister_worker('w1')").fetchone() == (False,)


@pytest.mark.parametrize("bad", ["", None])
def test_deregister_worker_refuses_an_empty_name(conn: psycopg.Connection[Any], bad: str | None) -> None:
    conn.execute("SELECT pgjobs.worker_heartbeat('w1', '{}')")
    with pytest.raises(psycopg.Error) as err:
        conn.execute("SELECT pgjobs.deregister_worker(%s)", (bad,))
    assert err.value.sqlstate == "PJ002" and "worker" in str(err.value)
    assert conn.execute("SELECT count(*) FROM pgjobs.workers").fetchone() == (1,)


def test_list_workers_marks_silent_ones_stale(dsn: str, conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT pgjobs.worker_heartbeat('fresh', '{\"heartbeat_interval\": 10}')")
    conn.execute("SELECT pgjobs.worker_heartbeat('quick', '{\"heartbeat_interval\": 1}')")
    conn.execute("SELECT pgjobs.worker_heartbeat('bogus', '{\"heartbeat_interval\": \"x\"}')")
    conn.execute("SELECT pgjobs.worker_heartbeat('huge', '{\"heartbeat_interval\": 1e300}')")  # ignored, no overflow
    conn.execute("SELECT pgjobs.worker_heartbeat('old', '{}')")
    # quick: silent 5 s, more than 3 of its 1 s beats; fresh: 5 s is less than 3 x 10 s; old: 1 min > 30 s
    conn.execute(
        "UPDATE pgjobs.workers SET last_seen = now() - interval '5 seconds' WHERE id IN ('fresh', 'quick', 'huge')"
    )
    conn.execute("UPDATE pgjobs.workers SET last_seen = now() - interval '1 minute' WHERE id = 'old'")
    with Client(dsn) as client:
        status = {w.id: w.status for w in client.list_workers()}
        assert status == {"fresh": "live", "quick": "stale", "bogus": "live", "old": "stale", "huge": "live"}
        assert {w.id for w in client.list_workers() if w.live} == {"fresh", "bogus", "huge"}
        # an explicit threshold overrides every worker's own
        assert {w.id: w.status for w in client.list_workers(stale_after=120)} == dict.fromkeys(status, "live")
        assert not client.deregister_worker("nobody")
        for bad in (-1, timedelta(days=365 * 200)):
            with pytest.raises(pgjobs.InvalidArgument, match="stale_after"):
                client.list_workers(stale_after=bad)


def test_stats_marks_stale_workers(dsn: str, conn: psycopg.Connection[Any], capsys: pytest.CaptureFixture[str]) -> None:
    from pgjobs.cli import main

    conn.execute("SELECT pgjobs.worker_heartbeat('gone-quiet', '{}')")
    conn.execute("UPDATE pgjobs.workers SET last_seen = now() - interval '1 hour'")
    conn.execute("SELECT pgjobs.worker_heartbeat('busy', '{}')")
    assert main(["--dsn", dsn, "stats", "--json"]) == 0
    workers = {w["id"]: w["status"] for w in json.loads(capsys.readouterr().out)["workers"]}
    assert workers == {"gone-quiet": "stale", "busy": "live"}
    assert main(["--dsn", dsn, "stats"]) == 0
    out = capsys.readouterr().out
    assert "status" in out and "stale" in out and "live" in out


# ------------------------------------------------------------------------------------------ log format


def _record(msg: str, level: int = logging.INFO, **extra: Any) -> logging.LogRecord:
    record = logging.getLogger("pgjobs.worker").makeRecord("pgjobs.worker", level, __file__, 1, msg, (), None)
    record.__dict__.update(extra)
    return record


def test_log_formats_carry_timestamp_level_and_fields() -> None:
    out = io.StringIO()
    handler = configure_logging("debug", "json", out)
    try:
        handler.handle(_record("job 1 (k) attempt 2 succeeded", job_id=1, kind="k", attempt=2, outcome="succeeded"))
        line = json.loads(out.getvalue())
        assert line["level"] == "INFO" and line["logger"] == "pgjobs.worker"
        assert line["ts"].endswith("Z") and "T" in line["ts"]
        assert (line["job_id"], line["kind"], line["attempt"], line["outcome"]) == (1, "k", 2, "succeeded")
        assert logging.getLogger().level == logging.DEBUG
        out2 = io.StringIO()
        handler = configure_logging("warning", "text", out2)
        assert len([h for h in logging.getLogger().handlers if h.get_name() == "pgjobs"]) == 1  # replaced
        handler.handle(_record("hello", logging.WARNING))
        text = out2.getvalue()
        assert " WARNING pgjobs.worker: hello" in text and text[:4].isdigit()
        with pytest.raises(ValueError, match="'loud'"):
            configure_logging("loud")
        with pytest.raises(ValueError, match="'xml'"):
            configure_logging("info", "xml")
    finally:
        logging.getLogger().removeHandler(handler)
        logging.getLogger().setLevel(logging.WARNING)


def test_outage_logs_once_per_change_of_state(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("pgjobs.test-outage")
    outage = Outage(log, blip=0.05)
    with caplog.at_level(logging.INFO, logger="pgjobs.test-outage"):
        outage.restored("claim")  # nothing was down: no line
        outage.lost("complete", OSError("idle connection died"))  # a blip: healed at once, no line
        outage.restored("complete")
        for i in range(50):
            outage.lost("claim" if i % 2 else "complete", OSError("connection refused\nsecond line"), 0.1)
            time.sleep(0.002)
        outage.restored("listen")
        outage.restored("claim")
        outage.lost("heartbeat", "server closed the connection")
        time.sleep(0.06)
        outage.lost("heartbeat", "server closed the connection")
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert len(lines) == 3, lines
    assert lines[0][0] == "WARNING" and "connection refused" in lines[0][1] and "database unreachable" in lines[0][1]
    assert "second line" not in lines[0][1]
    assert lines[1][0] == "INFO" and "reachable again" in lines[1][1] and "50 failed" in lines[1][1]
    assert lines[2][0] == "WARNING" and "heartbeat" in lines[2][1]


# ------------------------------------------------------------------------------------------ traces


class _Exporter(InMemorySpanExporter):
    """Keeps spans while this module runs; afterwards drops them (the provider stays set for the process)."""

    keep = True

    def export(self, spans: Any) -> Any:
        if not self.keep:
            return SpanExportResult.SUCCESS
        return super().export(spans)


@pytest.fixture(scope="module")
def spans() -> Iterator[InMemorySpanExporter]:
    """The process's tracer provider (settable once per process) exporting to memory."""
    exporter = _Exporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter
    exporter.keep = False
    exporter.clear()


def _named(exporter: InMemorySpanExporter, prefix: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name.startswith(prefix)]


def _traceparent(span: ReadableSpan) -> str:
    ctx = span.get_span_context()
    assert ctx is not None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}"


def _ids(traceparent: str) -> str:
    """version-trace_id-span_id (the flags byte may carry the W3C level-2 random bit)."""
    return traceparent.rsplit("-", 1)[0]


def test_enqueue_outside_a_span_stores_no_trace_context(dsn: str, spans: InMemorySpanExporter) -> None:
    spans.clear()
    with Client(dsn) as client:
        job = client.enqueue("k", meta={"tag": 1})
        st = client.job_status(job.id)
    assert st is not None and st.meta == {"tag": 1}
    assert _named(spans, "create") == []


def test_enqueue_in_a_span_stores_its_create_span_context(dsn: str, spans: InMemorySpanExporter) -> None:
    spans.clear()
    tracer = trace.get_tracer("test")
    with Client(dsn) as client, tracer.start_as_current_span("request") as outer:
        one = client.enqueue("k", queue="mail", meta={"tag": 1})
        mine = client.enqueue("k", meta={"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"})
        many = client.enqueue_many([{"kind": "a", "queue": "q"}, {"kind": "b", "queue": "q", "meta": {"x": 2}}])
        copied = client.enqueue_many([{"kind": "c", "queue": "bulk"}] * 3, method="copy")
        metas = [client.job_status(i).meta for i in (one.id, mine.id, *(s.id for s in many))]  # type: ignore[union-attr]
        copy_metas = [client.job_status(s.id).meta for s in copied]  # type: ignore[union-attr]
    creates = _named(spans, "create")
    assert [s.name for s in creates] == ["create mail", "create default", "create q", "create bulk"]  # copy: one
    first = creates[0]
    assert first.kind == trace.SpanKind.PRODUCER
    assert first.parent is not None and first.parent.span_id == outer.get_span_context().span_id
    attrs = dict(first.attributes or {})
    assert attrs["messaging.system"] == "pgjobs" and attrs["messaging.operation.type"] == "create"
    assert attrs["messaging.destination.name"] == "mail" and attrs["messaging.message.id"] == str(one.id)
    assert metas[0].keys() == {"tag", "traceparent"} and _ids(metas[0]["traceparent"]) == _traceparent(first)
    assert metas[1]["traceparent"] == "00-" + "1" * 32 + "-" + "2" * 16 + "-01"  # the caller's own wins
    assert dict(creates[2].attributes or {})["messaging.batch.message_count"] == 2
    assert metas[2]["traceparent"] == metas[3]["traceparent"]
    assert _ids(metas[2]["traceparent"]) == _traceparent(creates[2])
    assert metas[3]["x"] == 2
    assert {_ids(m["traceparent"]) for m in copy_metas} == {_traceparent(creates[3])}  # through COPY too


# ------------------------------------------------------------------------------------------ worker


def test_async_enqueue_many_in_a_span_and_declared_queues(dsn: str, spans: InMemorySpanExporter) -> None:
    app = App()

    @app.job("mailer", queue="mail")
    async def mailer(payload: Any, ctx: pgjobs.JobContext) -> None:
        return None

    spans.clear()

    async def main() -> list[dict[str, Any]]:
        async with AsyncClient(dsn, app=app) as client:
            with trace.get_tracer("test").start_as_current_span("request"):
                one = await client.enqueue("mailer", {})  # its declared queue names the span
                many = await client.enqueue_many([{"kind": "mailer"}, {"kind": "mailer", "meta": {"x": 1}}])
            return [(await client.job_status(i)).meta for i in (one.id, *(s.id for s in many))]  # type: ignore[union-attr]

    metas = anyio.run(main)
    creates = _named(spans, "create")
    assert [s.name for s in creates] == ["create mail", "create mail"]
    assert _ids(metas[0]["traceparent"]) == _traceparent(creates[0])
    assert metas[1]["traceparent"] == metas[2]["traceparent"] and metas[2]["x"] == 1
    assert _ids(metas[1]["traceparent"]) == _traceparent(creates[1])
    assert dict(creates[1].attributes or {})["messaging.batch.message_count"] == 2


def _outcome_app(started: threading.Event) -> App:
    app = App()

    @app.job("ok")
    async def ok(payload: Any, ctx: pgjobs.JobContext) -> int:
        return 1

    @app.job("flaky")
    async def flaky(payload: Any, ctx: pgjobs.JobContext) -> int:
        if ctx.attempt == 1:
            raise Retry(0, "once more")
        return ctx.attempt

    @app.job("broken")
    def broken(payload: Any, ctx: pgjobs.SyncJobContext) -> None:
        raise ValueError("no good\nsecond line")

    @app.job("long")
    async def long(payload: Any, ctx: pgjobs.JobContext) -> None:
        started.set()
        await ctx.cancelled.wait()

    return app


async def _run_outcomes(client: AsyncClient, started: threading.Event) -> dict[str, int]:
    ids = {k: (await client.enqueue(k, {}, max_attempts=1 if k == "broken" else 20)).id
           for k in ("ok", "flaky", "broken", "long")}  # fmt: skip
    await wait_state(client, ids["ok"], JobState.SUCCEEDED)
    await wait_state(client, ids["flaky"], JobState.SUCCEEDED)
    await wait_state(client, ids["broken"], JobState.FAILED)
    await anyio.to_thread.run_sync(started.wait, 10)
    await client.cancel(ids["long"])
    await wait_state(client, ids["long"], JobState.CANCELLED)
    return ids


def _scrape(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_worker_metrics_endpoint(dsn: str) -> None:
    started = threading.Event()
    seen: dict[str, Any] = {}

    async def body(worker: Worker, client: AsyncClient) -> None:
        await _run_outcomes(client, started)
        assert worker.metrics is not None and worker.metrics.port
        blocker = await client.enqueue("long", {})
        await wait_state(client, blocker.id, JobState.ACTIVE)
        while worker.active < 1:  # the claim committed; its rows reach the worker a moment later
            await anyio.sleep(0.01)
        seen.update(_scrape(worker.metrics.port))
        seen["port"] = worker.metrics.port

    worker = run_worker(_outcome_app(started), dsn, body, metrics_port=0, queues={"default": 3}, grace_period=0.2)
    processed = {
        (s.labels["kind"], s.labels["outcome"]): s.value
        for s in seen["pgjobs_jobs_processed"].samples
        if s.name.endswith("_total")
    }
    assert processed == {
        ("ok", "succeeded"): 1, ("flaky", "retried"): 1, ("flaky", "succeeded"): 1, ("broken", "failed"): 1,
        ("long", "cancelled"): 1,
    }  # fmt: skip
    assert all(s.labels["queue"] == "default" for s in seen["pgjobs_jobs_processed"].samples)
    counts = {
        s.labels["kind"]: s.value for s in seen["pgjobs_job_duration_seconds"].samples if s.name.endswith("_count")
    }
    assert counts == {"ok": 1, "flaky": 2, "broken": 1, "long": 1}
    gauges = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in seen.values() if hasattr(f, "samples")
              for s in f.samples}  # fmt: skip
    assert gauges[("pgjobs_worker_active_jobs", (("queue", "default"),))] == 1  # the blocker
    assert gauges[("pgjobs_worker_capacity", (("queue", "default"),))] == 3
    assert gauges[("pgjobs_worker_listen_connected", ())] == 1
    assert gauges[("pgjobs_worker_database_up", ())] == 1
    assert gauges[("pgjobs_worker_claims_total", (("queue", "default"),))] >= 3  # first jobs, the retry, the blocker
    assert gauges[("pgjobs_worker_claimed_jobs_total", (("queue", "default"),))] == 6
    assert seen["pgjobs_worker_claim_duration_seconds"].samples
    assert gauges[("pgjobs_worker_completion_batches_total", ())] >= 1
    assert any(s.labels.get("worker") == worker.name for s in seen["pgjobs_worker_info"].samples)
    with pytest.raises(OSError):  # the endpoint stops with the worker
        _scrape(seen["port"])


def test_worker_logs_each_job_and_its_stop_sequence(dsn: str, conn: psycopg.Connection[Any]) -> None:
    started = threading.Event()
    out = io.StringIO()
    handler = configure_logging("info", "json", out)
    try:
        ids: dict[str, int] = {}

        async def body(worker: Worker, client: AsyncClient) -> None:
            ids.update(await _run_outcomes(client, started))

        worker = run_worker(_outcome_app(started), dsn, body)
    finally:
        logging.getLogger().removeHandler(handler)
        logging.getLogger().setLevel(logging.WARNING)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    ends = [(r["kind"], r["attempt"], r["outcome"], r["level"]) for r in lines if r.get("event") == "job.end"]
    assert sorted(ends) == sorted([
        ("ok", 1, "succeeded", "INFO"), ("flaky", 1, "retried", "WARNING"), ("flaky", 2, "succeeded", "INFO"),
        ("broken", 1, "failed", "WARNING"), ("long", 1, "cancelled", "INFO"),
    ])  # fmt: skip
    broken = next(r for r in lines if r.get("kind") == "broken" and r.get("event") == "job.end")
    assert broken["job_id"] == ids["broken"] and broken["duration_s"] >= 0 and broken["ts"].endswith("Z")
    assert broken["error"] == "ValueError: no good" and "second line" not in broken["message"]
    assert not [r for r in lines if r.get("event") == "job.start"]  # DEBUG only
    events = [r["event"] for r in lines if str(r.get("event", "")).startswith("worker.")]
    assert events == ["worker.start", "worker.stopping", "worker.deregistered", "worker.stopped"]
    assert conn.execute("SELECT count(*) FROM pgjobs.workers WHERE id = %s", (worker.name,)).fetchone() == (0,)


def test_debug_logs_job_starts(dsn: str) -> None:
    out = io.StringIO()
    handler = configure_logging("debug", "text", out)
    app = App()

    @app.job("ok")
    async def ok(payload: Any, ctx: pgjobs.JobContext) -> None:
        return None

    try:

        async def body(worker: Worker, client: AsyncClient) -> None:
            await wait_state(client, (await client.enqueue("ok", {})).id, JobState.SUCCEEDED)

        run_worker(app, dsn, body)
    finally:
        logging.getLogger().removeHandler(handler)
        logging.getLogger().setLevel(logging.WARNING)
    text = out.getvalue()
    start = text.index("attempt 1 started")
    assert " DEBUG   pgjobs.worker: job " in text[start - 60 : start]
    assert text.index("attempt 1 succeeded in ") > start


def _attr(span: ReadableSpan, key: str) -> Any:
    return dict(span.attributes or {}).get(key)


def test_each_attempt_runs_in_a_span_linked_to_its_enqueue(dsn: str, spans: InMemorySpanExporter) -> None:
    started = threading.Event()
    app = _outcome_app(started)
    inner: list[Any] = []

    @app.job("nested")
    async def nested(payload: Any, ctx: pgjobs.JobContext) -> None:
        with trace.get_tracer("handler").start_as_current_span("inside") as span:
            inner.append(span)

    spans.clear()
    ids: dict[str, int] = {}

    async def body(worker: Worker, client: AsyncClient) -> None:
        with trace.get_tracer("test").start_as_current_span("request"):
            ids["nested"] = (await client.enqueue("nested", {})).id
        ids.update(await _run_outcomes(client, started))
        await wait_state(client, ids["nested"], JobState.SUCCEEDED)

    worker = run_worker(app, dsn, body)
    assert worker.tracer is not None
    done = spans.get_finished_spans()
    process = {(_attr(s, "messaging.message.id"), _attr(s, "messaging.pgjobs.attempt")): s
               for s in done if s.name == "process default"}  # fmt: skip
    assert set(process) == {(str(ids[k]), 1) for k in ids} | {(str(ids["flaky"]), 2)}
    nested_span = process[(str(ids["nested"]), 1)]
    attrs = dict(nested_span.attributes or {})
    assert nested_span.kind == trace.SpanKind.CONSUMER and nested_span.parent is None
    assert attrs["messaging.system"] == "pgjobs" and attrs["messaging.operation.type"] == "process"
    assert attrs["messaging.destination.name"] == "default" and attrs["messaging.pgjobs.kind"] == "nested"
    assert attrs["messaging.pgjobs.outcome"] == "succeeded" and attrs["messaging.client.id"] == worker.name
    (create,) = [s for s in done if s.name == "create default" and dict(s.attributes or {}).get(
        "messaging.message.id") == str(ids["nested"])]  # fmt: skip
    assert [link.context.span_id for link in nested_span.links] == [create.get_span_context().span_id]
    assert not process[(str(ids["ok"]), 1)].links  # enqueued outside any span: nothing to link
    assert inner and inner[0].parent is not None  # the handler's own span is a child of the attempt's
    assert inner[0].parent.span_id == nested_span.get_span_context().span_id
    broken = process[(str(ids["broken"]), 1)]
    assert broken.status.status_code == trace.StatusCode.ERROR
    assert dict(broken.attributes or {})["error.type"] == "ValueError"
    assert any(e.name == "exception" for e in broken.events)
    settles = [s for s in done if s.name.startswith("settle")]
    fail_settle = [s for s in settles if dict(s.attributes or {}).get("messaging.operation.name") == "fail"]
    assert {s.parent.span_id for s in fail_settle if s.parent} == {
        process[(str(ids["broken"]), 1)].get_span_context().span_id,
        process[(str(ids["flaky"]), 1)].get_span_context().span_id,
    }
    batches = [s for s in settles if dict(s.attributes or {}).get("messaging.operation.name") == "complete_many"]
    linked = {link.context.span_id for s in batches for link in s.links}
    assert nested_span.get_span_context().span_id in linked
    assert all(dict(s.attributes or {})["messaging.operation.type"] == "settle" for s in settles)
    assert any(dict(s.attributes or {}).get("messaging.operation.name") == "ack_cancel" for s in settles)


def test_tracing_off_without_a_tracer_provider_choice(dsn: str, spans: InMemorySpanExporter) -> None:
    app = App()

    @app.job("ok")
    async def ok(payload: Any, ctx: pgjobs.JobContext) -> None:
        return None

    async def body(worker: Worker, client: AsyncClient) -> None:
        await wait_state(client, (await client.enqueue("ok", {})).id, JobState.SUCCEEDED)

    spans.clear()
    worker = run_worker(app, dsn, body, tracing=False)
    assert worker.tracer is None
    assert not [s for s in spans.get_finished_spans() if s.name.startswith(("process", "settle"))]


def test_stop_sequence_with_jobs_past_the_grace_period(dsn: str, conn: psycopg.Connection[Any]) -> None:
    app = App()
    running = threading.Event()

    @app.job("stuck")
    async def stuck(payload: Any, ctx: pgjobs.JobContext) -> None:
        running.set()
        await anyio.sleep(60)

    out = io.StringIO()
    handler = configure_logging("info", "json", out)
    try:

        async def body(worker: Worker, client: AsyncClient) -> None:
            for _ in range(2):
                await client.enqueue("stuck", {})
            await anyio.to_thread.run_sync(running.wait, 10)
            while worker.active < 2:
                await anyio.sleep(0.01)

        run_worker(app, dsn, body, grace_period=0.3)
    finally:
        logging.getLogger().removeHandler(handler)
        logging.getLogger().setLevel(logging.WARNING)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    stop = [r for r in lines if str(r.get("event", "")).startswith("worker.") and r["event"] != "worker.start"]
    assert [r["event"] for r in stop] == [
        "worker.stopping", "worker.releasing", "worker.released", "worker.deregistered", "worker.stopped",
    ]  # fmt: skip
    assert stop[0]["jobs"] == 2 and "2 job(s) finishing (up to 0.3 s" in stop[0]["message"]
    assert stop[1]["jobs"] == 2 and stop[2]["jobs"] == 2
    assert "released 2" in stop[4]["message"]
    assert sorted(r["outcome"] for r in lines if r.get("event") == "job.end") == ["released", "released"]
    assert conn.execute("SELECT count(*) FROM pgjobs.jobs WHERE state = 'pending'").fetchone() == (2,)


def test_worker_command_flags_logs_metrics_and_stop(dsn: str, tmp_path: Path) -> None:
    """``pgjobs worker --log-format json --metrics-port 0 --no-prepare --listen-dsn``: JSON lines on stderr,
    the metrics endpoint while it runs, the stop sequence on SIGTERM, deregistered after."""
    (tmp_path / "ops_app.py").write_text(
        "import pgjobs\napp = pgjobs.App()\n\n@app.job('hello')\nasync def hello(payload, ctx):\n    return 'hi'\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PGJOBS_DSN", "DATABASE_URL")}
    env["PYTHONPATH"] = str(REPO)
    cmd = [sys.executable, "-m", "pgjobs", "--dsn", dsn, "worker", "--app", "ops_app:app", "--log-format", "json",
           "--metrics-port", "0", "--no-prepare", "--listen-dsn", dsn]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[dict[str, Any]] = []
    try:
        assert proc.stderr is not None
        port = None
        deadline = time.monotonic() + 30
        while port is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if line.startswith("{"):
                lines.append(json.loads(line))
                if lines[-1].get("event") == "worker.metrics":
                    port = int(lines[-1]["message"].rsplit(":", 1)[1].split("/")[0])
        assert port is not None, lines
        with Client(dsn) as client:
            job = client.enqueue("hello", {})
            while (st := client.job_status(job.id)) is None or st.state != JobState.SUCCEEDED:
                time.sleep(0.02)
        metrics = _scrape(port)
        samples = metrics["pgjobs_jobs_processed"].samples
        assert [(s.labels["kind"], s.labels["outcome"], s.value) for s in samples if s.name.endswith("_total")] == [
            ("hello", "succeeded", 1.0)
        ]
    finally:
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=30)
    assert proc.returncode == 143, rest  # stopped by SIGTERM
    lines += [json.loads(line) for line in rest.splitlines() if line.startswith("{")]
    events = [r.get("event") for r in lines]
    assert "job.end" in events
    assert events[-3:] == ["worker.stopping", "worker.deregistered", "worker.stopped"], events
    assert all(r["ts"].endswith("Z") and r["level"] for r in lines)
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM pgjobs.workers").fetchone() == (0,)


def test_without_opentelemetry_nothing_is_imported_and_nothing_stored(dsn: str) -> None:
    """opentelemetry made unimportable (as when the otel extra is not installed): enqueue and a worker run work,
    no trace context is stored, and no opentelemetry module is ever loaded."""
    # as if not installed: find_spec finds nothing, and an import fails
    script = textwrap.dedent(
        """
        import importlib.abc, importlib.util, sys

        class NoOtel(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "opentelemetry":
                    raise ModuleNotFoundError(name)
                return None

        sys.meta_path.insert(0, NoOtel())
        real_find_spec = importlib.util.find_spec
        importlib.util.find_spec = lambda name, *a: (
            None if name.split(".")[0] == "opentelemetry" else real_find_spec(name, *a)
        )
        """
    )
    script += textwrap.dedent(
        f"""
        import pgjobs
        from pgjobs.client import tracecontext
        from pgjobs.runtime import tracing
        assert not tracecontext.available() and not tracing.enabled(None)
        with pgjobs.Client({dsn!r}) as client:
            job = client.enqueue("k", meta={{"tag": 1}})
            assert client.job_status(job.id).meta == {{"tag": 1}}
        try:
            tracing.enabled(True)
        except RuntimeError as exc:
            assert "pgjobs-queue[otel]" in str(exc)
        else:
            raise AssertionError("tracing=True without opentelemetry must refuse")
        assert not [m for m in sys.modules if m.startswith("opentelemetry")], sorted(sys.modules)
        print("ok")
        """
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr

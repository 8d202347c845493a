"""Realistic data for the dashboard tests and screenshots: jobs in every state, a failed job with a real
traceback, a running job with progress, a batch with dependencies, a schedule, live and stale workers."""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import psycopg

import pgjobs
from pgjobs.client.graph import on_success


@dataclass
class Seeded:
    failed_id: int
    active_id: int
    active_token: object
    pending_id: int
    batch_id: int
    batch_jobs: list[int]
    schedule: str
    traceback_text: str


def _traceback() -> str:
    def parse_invoice(data: dict[str, str]) -> int:
        return int(data["amount"])

    try:
        parse_invoice({"amount": "12,50"})
    except ValueError:
        return traceback.format_exc()
    raise AssertionError("unreachable")


def seed(dsn: str) -> Seeded:
    with pgjobs.Client(dsn) as c:
        c.configure_queue("emails", fair=True, max_active_per_group=2)
        for i in range(6):
            c.enqueue("send_email", {"to": f"user{i}@example.org"}, queue="emails", group_key=f"tenant-{i % 3}")
        pending = c.enqueue("resize_image", {"image": "cat.png", "size": 128}, unique_key="cat.png")
        # a job that failed for good, with a traceback
        failed = c.enqueue("import_invoice", {"file": "invoice-42.csv"}, queue="billing", max_attempts=1)
        tb = _traceback()
        [claimed] = c.claim("worker-a", ["billing"])
        c.fail(claimed.id, claimed.lease_token, tb)
        # succeeded ones, for the chart
        for i in range(4):
            c.enqueue("report", {"n": i}, queue="billing")
        for job in c.claim("worker-a", ["billing"], max_jobs=4):
            c.complete(job.id, job.lease_token, {"rows": 10})
        # a running job with progress
        running = c.enqueue("export_csv", {"rows": 1000}, queue="exports")
        [active] = c.claim("worker-a", ["exports"], lease=300)
        c.progress(active.id, active.lease_token, {"done": 250, "total": 1000, "message": "rows"})
        # a batch: fetch -> (parse a, parse b) -> merge
        b = c.batch()
        fetch = b.enqueue("fetch", {"url": "https://example.org/data"}, queue="etl")
        pa = b.enqueue("parse", {"part": "a"}, after=[on_success(fetch)], queue="etl")
        pb = b.enqueue("parse", {"part": "b"}, after=[on_success(fetch)], queue="etl")
        merge = b.enqueue("merge", {}, after=[on_success(pa), on_success(pb)], queue="etl")
        b.then("notify", {"channel": "#data"}, queue="etl")
        b.submit()
        assert b.batch_id is not None
        [f] = c.claim("worker-b", ["etl"])
        c.complete(f.id, f.lease_token, {"bytes": 2048})
        c.add_schedule("nightly-report", "report", "0 3 * * *", queue="billing", payload={"kind": "nightly"})
        c.worker_heartbeat(
            "worker-a", {"host": "app-1", "pid": 4242, "queues": ["billing", "exports"], "concurrency": 8}
        )
        c.worker_heartbeat("worker-b", {"host": "app-2", "pid": 777, "queues": ["etl"], "concurrency": 4})
    with psycopg.connect(dsn, autocommit=True) as conn:  # worker-b went silent two minutes ago
        conn.execute(
            "UPDATE pgjobs.workers SET last_seen = %s WHERE id = 'worker-b'",
            (datetime.now(UTC) - timedelta(minutes=2),),
        )
    return Seeded(
        failed_id=failed.id,
        active_id=running.id,
        active_token=active.lease_token,
        pending_id=pending.id,
        batch_id=b.batch_id,
        batch_jobs=[j.id for j in (fetch, pa, pb, merge) if j.id is not None],
        schedule="nightly-report",
        traceback_text=tb,
    )


def seed_big_batch(dsn: str, members: int, fan: bool) -> int:
    """A batch of ``members`` jobs, some of them run (succeeded, failed, one running). ``fan``: one
    ``fetch``, then ``members - 2`` ``parse`` jobs after it, then one ``merge`` after them all; otherwise
    independent ``resize`` (70 %) and ``thumbnail`` jobs. Either way a ``notify`` continuation follows the
    batch. Returns the batch id."""
    queue = f"big-{members}"
    with pgjobs.Client(dsn) as c:
        b = c.batch()
        if fan:
            fetch = b.enqueue("fetch", {"url": "https://example.org/archive.zip"}, queue=queue)
            parts = [
                b.enqueue("parse", {"part": i}, after=[on_success(fetch)], queue=queue) for i in range(members - 2)
            ]
            b.enqueue("merge", {}, after=[on_success(p) for p in parts], queue=queue)
        else:
            for i in range(members):
                b.enqueue("resize" if i % 10 < 7 else "thumbnail", {"image": f"img-{i}.png"}, queue=queue)
        b.then("notify", {"channel": "#media"}, queue=queue)
        b.submit()
        assert b.batch_id is not None
        done = c.claim("worker-a", [queue], max_jobs=1 if fan else members // 2)
        for job in done:
            c.complete(job.id, job.lease_token)
        ran = c.claim("worker-a", [queue], max_jobs=members // 3)
        for i, job in enumerate(ran):
            if i % 7 == 0:
                c.dead_letter(job.id, job.lease_token, "ValueError: corrupt input")
            elif i < len(ran) - 1:
                c.complete(job.id, job.lease_token)
    return b.batch_id

"""The jobs of ``pgjobs.cli.demo``: a small App and the showcase it runs.

Run its worker on its own with ``pgjobs worker --app pgjobs.cli.demo_app:app --queues pgjobs-demo=20`` and
enqueue the showcase with ``pgjobs demo --no-worker`` (that is what ``docker/compose.yaml`` does).

Everything the demo reports is durable: the story of the interrupted report lives in the job's
checkpoint, so it reads the same whichever process (or container) ran the attempts.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio

import pgjobs

QUEUE = "pgjobs-demo"

app = pgjobs.App()


class SimulatedCrash(RuntimeError):
    """The report's first attempt dies half way, as if its machine lost power."""


class CardDeclined(RuntimeError):
    pass


@app.job("demo.thumbnail", queue=QUEUE)
async def thumbnail(payload: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """Plain async work."""
    await anyio.sleep(payload["ms"] / 1000)
    return {"thumbnail": f"{payload['image']}.128.webp"}


@app.job("demo.send_email", queue=QUEUE)
def send_email(payload: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """A sync handler (it runs in a worker thread); some fail and are retried after the SQL backoff (~1 s)."""
    time.sleep(payload["ms"] / 1000)
    if ctx.attempt <= payload.get("fail_attempts", 0):
        raise ConnectionError(f"SMTP 421 from mx.example.com for {payload['to']}: try again later")
    return {"sent_to": payload["to"]}


@app.job("demo.call_api", queue=QUEUE)
async def call_api(payload: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """Rate limited on its first attempt: ``Retry(after=...)`` picks the next run time itself."""
    await anyio.sleep(payload["ms"] / 1000)
    if ctx.attempt <= payload.get("rate_limited_attempts", 0):
        raise pgjobs.Retry(after=payload.get("retry_after", 0.3))
    return {"status": 200}


@app.job("demo.charge_card", queue=QUEUE, max_attempts=3)
async def charge_card(payload: dict[str, Any], ctx: Any) -> None:
    """Always declined: after its last attempt the job ends ``failed``, with every error kept."""
    await anyio.sleep(0.02)
    raise CardDeclined(f"card ending {payload['card']} declined (attempt {ctx.attempt})")


@app.job("demo.import_csv", queue=QUEUE)
async def import_csv(payload: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """Reports its progress as ``{"done", "total"}``: `pgjobs status ID --follow` draws a bar from it."""
    rows, step = payload["rows"], payload["step"]
    for done in range(step, rows + step, step):
        await anyio.sleep(payload["step_seconds"])
        await ctx.report_progress({"done": min(done, rows), "total": rows, "message": "rows imported"})
    return {"rows": rows}


@app.job("demo.nightly_report", queue=QUEUE, timeout=120)
async def nightly_report(payload: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """A long job that saves a checkpoint after every chunk and resumes from it on its next attempt.

    The checkpoint is ``{"next_chunk", "runs": [{"attempt", "first", "last", "crashed"}]}``: the next
    attempt starts at ``next_chunk``, and ``runs`` is the story the demo prints. The first attempt
    crashes after ``crash_after`` chunks, so the second one has something to resume.
    """
    chunks = int(payload["chunks"])
    checkpoint = ctx.checkpoint if isinstance(ctx.checkpoint, dict) else {}
    start = int(checkpoint.get("next_chunk", 1))
    runs: list[dict[str, Any]] = list(checkpoint.get("runs", []))
    run: dict[str, Any] = {"attempt": ctx.attempt, "first": start, "last": start - 1, "crashed": False}
    runs.append(run)
    for chunk in range(start, chunks + 1):
        await anyio.sleep(payload["chunk_seconds"])  # the chunk's work
        run["last"] = chunk
        # the chunk is done only once this is durable: a crash after it never redoes the chunk
        await ctx.save_checkpoint({"next_chunk": chunk + 1, "runs": runs})
        await ctx.report_progress({"done": chunk, "total": chunks, "message": f"chunk {chunk}/{chunks}"})
        if len(runs) == 1 and chunk == payload.get("crash_after"):
            run["crashed"] = True
            await ctx.save_checkpoint({"next_chunk": chunk + 1, "runs": runs})
            raise SimulatedCrash(f"simulated crash after chunk {chunk} of {chunks} (the machine lost power)")
    return {"chunks": chunks, "runs": runs}


@app.job("demo.cleanup", queue=QUEUE)
async def cleanup(payload: dict[str, Any], ctx: Any) -> None:
    """Scheduled an hour ahead and cancelled by the demo before it runs."""


@dataclass(frozen=True)
class Showcase:
    ids: list[int]
    report_id: int
    import_id: int
    cancelled_id: int
    kinds: dict[str, int]
    queue: str = QUEUE


def showcase_specs(seed: int = 7) -> list[dict[str, Any]]:
    """About 300 job specs for ``enqueue_many``; deterministic for a given seed."""
    rnd = random.Random(seed)
    specs: list[dict[str, Any]] = [
        {
            "ref": "report",
            "kind": "demo.nightly_report",
            "queue": QUEUE,
            "priority": -1,
            "payload": {"chunks": 12, "chunk_seconds": 0.25, "crash_after": 5},
        },
        {
            "ref": "import",
            "kind": "demo.import_csv",
            "queue": QUEUE,
            "priority": -1,
            "payload": {"rows": 5000, "step": 250, "step_seconds": 0.15},
        },
        {
            "ref": "cleanup",
            "kind": "demo.cleanup",
            "queue": QUEUE,
            "run_at": (datetime.now(UTC) + timedelta(hours=1)).isoformat(),
        },
    ]
    for i in range(200):
        specs.append(
            {"kind": "demo.thumbnail", "queue": QUEUE, "payload": {"image": f"img-{i:03}", "ms": rnd.randint(40, 160)}}
        )
    for i in range(60):
        fail = 2 if i % 10 == 0 else 1 if i % 3 == 0 else 0
        specs.append(
            {
                "kind": "demo.send_email",
                "queue": QUEUE,
                "payload": {"to": f"user{i}@example.com", "ms": rnd.randint(20, 80), "fail_attempts": fail},
            }
        )
    for i in range(30):
        specs.append(
            {
                "kind": "demo.call_api",
                "queue": QUEUE,
                "payload": {"endpoint": f"/v1/items/{i}", "ms": rnd.randint(20, 60), "rate_limited_attempts": i % 2},
            }
        )
    for i in range(4):
        specs.append(
            {"kind": "demo.charge_card", "queue": QUEUE, "max_attempts": 3, "payload": {"card": f"{4242 + i}"}}
        )
    rnd.shuffle(specs)
    return specs


async def enqueue_showcase(client: pgjobs.AsyncClient) -> Showcase:
    """Enqueues the showcase in one ``enqueue_many`` call and cancels the job scheduled an hour ahead."""
    specs = showcase_specs()
    rows = await client.enqueue_many(specs)
    ids = [r.id for r in rows]
    by_ref = {r.ref: r.id for r in rows if r.ref}
    await client.cancel(by_ref["cleanup"])
    kinds: dict[str, int] = {}
    for spec in specs:
        kinds[spec["kind"]] = kinds.get(spec["kind"], 0) + 1
    return Showcase(ids, by_ref["report"], by_ref["import"], by_ref["cleanup"], kinds)

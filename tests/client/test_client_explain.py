"""Client.explain / AsyncClient.explain: the SQL answer as a typed Explanation, and its sentence."""

from __future__ import annotations

from datetime import UTC, datetime

import anyio
import pytest

from pgjobs import AsyncClient, Client
from pgjobs.client.explain import Explanation, Reason


def test_explain_returns_a_typed_record_with_a_sentence(dsn: str) -> None:
    with Client(dsn) as client:
        assert client.explain(424242) is None
        job = client.enqueue("mail.send", queue="mail")
        why = client.explain(job.id)
        assert why is not None and why.job_id == job.id and why.reason is Reason.NO_WORKER and why.blocked
        assert why.details["queue"] == "mail" and why.details["live_workers"] == 0
        assert why.describe() == "no live worker serves queue 'mail'"
        client.worker_heartbeat("w", {"queues": {"mail": 2}, "kinds": ["mail.send"]})
        client.configure_queue("mail", max_active=1)
        held = client.enqueue("mail.send", queue="mail")
        (got,) = client.claim("w", ["mail"])
        assert got.id == job.id
        why = client.explain(held.id)
        assert why is not None and why.reason is Reason.QUEUE_CAP
        assert why.describe() == "queue 'mail' is at its cap: 1 of 1 active"
        running = client.explain(job.id)
        assert running is not None and running.reason is Reason.RUNNING and not running.blocked
        assert running.describe().startswith("running on worker w, lease until ")
        client.configure_queue("mail", paused=True)
        why = client.explain(held.id)
        assert why is not None and why.reason is Reason.PAUSED and why.also == (Reason.QUEUE_CAP,)
        assert why.describe() == "queue 'mail' is paused (also: queue_cap)"
        assert why.to_json() == {"reason": "paused", "queue": "mail", "also": ["queue_cap"]}


@pytest.mark.parametrize(
    ("value", "sentence"),
    [
        (
            {"reason": "claimable", "queue": "q"},
            "claimable: nothing holds it back; a worker with a free slot takes it next",
        ),
        (
            {"reason": "behind_others", "queue": "q", "ahead": 1000, "at_least": True, "fair": False},
            "behind at least 1000 jobs ahead of it in claim order (priority, run_at, id) in queue 'q'",
        ),
        (
            {"reason": "behind_others", "queue": "f", "ahead": 1, "at_least": False, "fair": True, "group_key": "a"},
            "behind 1 job of group 'a' in fair queue 'f' (groups take turns)",
        ),
        (
            {"reason": "group_cap", "queue": "q", "group_key": "t1", "active": 2, "max_active_per_group": 2},
            "group 't1' of queue 'q' is at its cap: 2 of 2 active",
        ),
        (
            {"reason": "no_worker", "queue": "q", "kind": "k", "live_workers": 3, "queue_workers": 1,
             "last_seen": None},
            "no live worker handles kind 'k' on queue 'q' (1 live worker serves the queue)",
        ),
        (
            {"reason": "waiting_dependencies", "remaining": 2, "waiting_on": [
                {"job": 5, "on": "success", "state": "active"},
                {"batch": 7, "on": "complete", "state": "executing", "pending": 3, "total": 10}]},
            "waiting on 2 dependencies: job 5 (active, on success), batch 7 (executing, 3 of 10 pending, on complete)",
        ),
        (
            {"reason": "scheduled", "run_at": "2999-01-01T00:00:00+00:00", "retry": True, "attempt": 2,
             "max_attempts": 5, "last_error": "ValueError: boom"},
            "retry scheduled for 2999-01-01 00:00:00+0000 after attempt 2 of 5: ValueError: boom",
        ),
        (
            {"reason": "claimable", "queue": "q", "lease_lapsed_at": "2026-01-02T03:04:05+00:00", "last_worker": "w1",
             "settles_as": "failed"},
            "claimable: nothing holds it back; a worker with a free slot takes it next; the lease of w1 lapsed at"
            " 2026-01-02 03:04:05+0000: the next claim ends it as failed",
        ),
        (
            {"reason": "terminal", "state": "failed", "completed_at": "2026-01-02T03:04:05+00:00", "attempt": 3,
             "max_attempts": 3, "last_error": "ValueError: boom"},
            "failed at 2026-01-02 03:04:05+0000 (attempt 3 of 3): ValueError: boom",
        ),
    ],
)  # fmt: skip
def test_every_reason_has_its_sentence(value: dict[str, object], sentence: str) -> None:
    assert Explanation.from_json(1, value).describe() == sentence


def test_async_explain(dsn: str) -> None:
    async def main() -> None:
        async with AsyncClient(dsn) as client:
            assert await client.explain(424242) is None
            job = await client.enqueue("k", run_at=datetime(2999, 1, 1, tzinfo=UTC))
            why = await client.explain(job.id)
            assert why is not None and why.reason is Reason.SCHEDULED
            assert why.describe() == "scheduled for 2999-01-01 00:00:00+0000 (also: no_worker)"

    anyio.run(main)

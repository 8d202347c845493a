"""sql/dashboard.sql through pgjobs/client/dashboard.py: what the dashboard reads, and bad input refused
with PJ002/PJ003 naming the value, changing nothing."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from psycopg_pool import AsyncConnectionPool

import pgjobs
from pgjobs.client.dashboard import AsyncDashboard, JobFilter
from pgjobs.errors import InvalidArgument, JobNotFound
from pgjobs.records import JobState


def _run(dsn: str, fn: Any) -> Any:
    async def main() -> Any:
        async with AsyncConnectionPool(dsn, min_size=1, max_size=2, kwargs={"autocommit": True}) as pool:
            return await fn(AsyncDashboard(pool))

    return asyncio.run(main())


@pytest.mark.smoke
def test_job_page_counts_search_and_no_lease_token(dsn: str) -> None:
    with pgjobs.Client(dsn) as c:
        for i in range(5):
            c.enqueue("mail", {"to": f"u{i}@example.org"}, queue="m")
        c.enqueue("other", {"note": "Needle in payload"}, unique_key="k-1")
        c.claim("w", ["m"])
    page = _run(dsn, lambda d: d.jobs(JobFilter(queue="m"), 2, 0))
    assert page.total == 5 and len(page.jobs) == 2 and not hasattr(page.jobs[0], "lease_token")
    assert _run(dsn, lambda d: d.jobs(JobFilter(search="needle"), 10, 0)).total == 1
    assert _run(dsn, lambda d: d.jobs(JobFilter(state=JobState.ACTIVE), 10, 0)).total == 1
    beyond = _run(dsn, lambda d: d.jobs(JobFilter(queue="m"), 2, 10))
    assert beyond.jobs == [] and beyond.total == 5
    queues = {q.queue: q for q in _run(dsn, lambda d: d.queues())}
    assert queues["m"].counts == {"pending": 4, "active": 1} and queues["m"].oldest_pending_seconds is not None
    assert queues["default"].counts == {"pending": 1}


def test_state_counts_count_the_filter_in_every_state(dsn: str) -> None:
    with pgjobs.Client(dsn) as c:
        for i in range(4):
            c.enqueue("mail", {"to": f"u{i}@example.org"}, queue="m")
        c.enqueue("other", {"note": "Needle"}, queue="m")
        c.enqueue("mail", {}, queue="elsewhere")
        [a] = c.claim("w", ["m"])
        c.complete(a.id, a.lease_token)
        c.cancel(c.enqueue("mail", {}, queue="m").id)
    assert _run(dsn, lambda d: d.state_counts(JobFilter(queue="m"))) == {"pending": 4, "succeeded": 1, "cancelled": 1}
    assert _run(dsn, lambda d: d.state_counts(JobFilter(queue="m", kind="other"))) == {"pending": 1}
    assert _run(dsn, lambda d: d.state_counts(JobFilter(search="NEEDLE"))) == {"pending": 1}
    # the filter's state is left out: the tabs count every state
    both = _run(dsn, lambda d: d.state_counts(JobFilter(state=JobState.SUCCEEDED, kind="mail")))
    assert both == {"pending": 4, "succeeded": 1, "cancelled": 1}  # 3 in m, 1 elsewhere
    assert _run(dsn, lambda d: d.state_counts(JobFilter(queue="nowhere"))) == {}


def test_throughput_has_one_point_per_minute(dsn: str) -> None:
    with pgjobs.Client(dsn) as c:
        c.enqueue("a", {})
        [j] = c.claim("w")
        c.complete(j.id, j.lease_token)
    points = _run(dsn, lambda d: d.throughput(15))
    assert len(points) == 15 and points[-1].succeeded == 1 and sum(p.failed for p in points) == 0


def test_bulk_reports_each_job_and_refusals_do_not_stop_it(dsn: str) -> None:
    with pgjobs.Client(dsn) as c:
        a = c.enqueue("a", {})
        b = c.enqueue("b", {})
        out = _run(dsn, lambda d: d.bulk("retry", [a.id, b.id, 999999], JobFilter()))
        assert [(o.id, o.done) for o in out] == [(a.id, False), (b.id, False), (999999, False)]
        assert "only failed or cancelled" in (out[0].error or "") and "not found" in (out[2].error or "")
        out = _run(dsn, lambda d: d.bulk("cancel", None, JobFilter(kind="a")))
        assert [(o.id, o.done) for o in out] == [(a.id, True)]
        assert c.job_status(b.id).state == "pending"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("call", "error", "says"),
    [
        (lambda d: d.bulk("explode", [1], JobFilter()), InvalidArgument, "must be cancel or retry, got 'explode'"),
        (lambda d: d.bulk("cancel", list(range(1, 12)), JobFilter(), 10), InvalidArgument, "at most 10 ids, got 11"),
        (lambda d: d.jobs(JobFilter(), 10001, 0), InvalidArgument, "max_rows must be between 0 and 10000, got 10001"),
        (lambda d: d.jobs(JobFilter(), 10, -1), InvalidArgument, "skip_rows must be >= 0, got -1"),
        (lambda d: d.throughput(0), InvalidArgument, "minutes must be between 1 and 1440, got 0"),
        (lambda d: d.trigger_schedule("nope"), JobNotFound, "schedule 'nope' not found"),
        (lambda d: d.state_counts(JobFilter(kind="k" * 1001)), InvalidArgument, "only_kind must be at most 1000 bytes"),
    ],
)  # fmt: skip
def test_bad_input_is_refused_naming_the_value(dsn: str, call: Any, error: type[Exception], says: str) -> None:
    with pgjobs.Client(dsn) as c:
        job = c.enqueue("a", {})
        with pytest.raises(error, match=says):
            _run(dsn, call)
        assert c.job_status(job.id).state == "pending"  # type: ignore[union-attr]
        assert len(c.list_jobs()) == 1


def test_trigger_schedule_enqueues_now_and_keeps_the_next_run(dsn: str) -> None:
    with pgjobs.Client(dsn) as c:
        before = c.add_schedule("nightly", "report", "0 3 * * *", queue="r", payload={"x": 1}, priority=3)
        job_id = _run(dsn, lambda d: d.trigger_schedule("nightly"))
        job = c.job_status(job_id)
        assert job is not None and (job.kind, job.queue, job.payload, job.priority) == ("report", "r", {"x": 1}, 3)
        assert job.state == "pending" and job.schedule_name == "nightly"
        assert c.get_schedule("nightly").next_run_at == before.next_run_at  # type: ignore[union-attr]

"""Many jobs in one call, all or nothing, with dependencies between them (``enqueue_many``).

PGJOBS_DSN=postgresql://localhost/app python examples/enqueue_many.py
"""

import os

import pgjobs

DSN = os.environ.get("PGJOBS_DSN", "postgresql://localhost/app")

with pgjobs.Client(DSN) as client:
    rows = client.enqueue_many(
        [
            {"kind": "fetch_page", "ref": "a", "payload": {"url": "https://example.com/a"}},
            {"kind": "fetch_page", "ref": "b", "payload": {"url": "https://example.com/b"}, "queue": "slow"},
            {"kind": "merge_pages", "ref": "m", "depends_on": [{"ref": "a"}, {"ref": "b"}]},  # waits for both
            {"kind": "page_oncall", "ref": "x", "depends_on": [{"ref": "m", "on": "failure"}]},
            {"kind": "daily_report", "ref": "r", "unique_key": "daily-report", "priority": 5},
        ]
    )
    for row in rows:
        job = client.job_status(row.id)
        assert job is not None
        print(f"{row.ref}: job {row.id} {job.kind} in {job.queue}, {job.state.value}")
    try:
        client.enqueue_many([{"kind": "ok"}, {"kind": "bad", "depends_on": [{"ref": "nowhere"}]}])
    except pgjobs.GraphError as exc:
        print(f"all or nothing: {type(exc).__name__}, {len(client.list_jobs(kind='ok'))} 'ok' jobs enqueued")

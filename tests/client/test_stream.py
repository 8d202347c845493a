"""The status stream: ``AsyncClient.subscribe`` over the durable event log (read_events), across processes:
history replay, reconnects and missed or forged hints that lose nothing, rollbacks that never appear, a long
transaction delivered when it commits, resuming from a cursor, filters, and the end of a stream over explicit
job ids."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest
from psycopg.types.json import Jsonb

from pgjobs import AsyncClient, JobState, StatusEvent
from tests.helpers.apps.procs import StartWorker, wait_for, worker_processes


@pytest.fixture
def start_worker(dsn: str, tmp_path: Path) -> Iterator[StartWorker]:
    with worker_processes(dsn, tmp_path) as start:
        yield start


def enqueue(conn: psycopg.Connection[Any], kind: str, queue: str = "default", payload: Any = None) -> int:
    row = conn.execute(
        "SELECT id FROM pgjobs.enqueue(kind => %s, payload => %s, queue => %s)", [kind, Jsonb(payload or {}), queue]
    ).fetchone()
    assert row is not None
    return int(row[0])


def claim_one(conn: psycopg.Connection[Any], queue: str = "default") -> tuple[int, Any]:
    row = conn.execute("SELECT id, lease_token FROM pgjobs.claim('tester', ARRAY[%s], 1)", [queue]).fetchone()
    assert row is not None
    return int(row[0]), row[1]


async def listening(conn: psycopg.Connection[Any], n: int, timeout: float = 30) -> None:
    """Until ``n`` subscribers LISTEN: their connections finished a first statement (a subscriber's first
    is its LISTEN) and wait idle."""
    with anyio.fail_after(timeout):
        while True:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgjobs-subscribe'"
                " AND datname = current_database() AND state = 'idle' AND query <> ''"
            ).fetchone()
            if row is not None and row[0] >= n:
                return
            await anyio.sleep(0.02)


def shape(events: list[StatusEvent]) -> list[tuple[str, int, Any]]:
    return [(e.state.value, e.attempt, e.progress) for e in events]


@pytest.mark.smoke
def test_a_subscriber_sees_every_transition_of_a_worker_in_another_process(
    dsn: str, conn: psycopg.Connection[Any], start_worker: StartWorker
) -> None:
    job = enqueue(conn, "steps")
    events: list[StatusEvent] = []

    async def main() -> None:
        async with AsyncClient(dsn) as client:
            stream = client.subscribe(job_ids=[job])
            with anyio.fail_after(60):
                async for ev in stream:
                    events.append(ev)
                    if len(events) == 1:  # subscribed (the first event is the job's history): start work
                        start_worker(name="streamed", poll_interval=0.5)

    anyio.run(main)  # ends by itself: the only watched job became terminal
    assert shape(events) == [
        ("pending", 0, None),
        ("active", 1, None),
        ("active", 1, {"attempt": 1, "pct": 50}),
        ("scheduled", 1, None),  # Retry(after=0.2)
        ("active", 2, None),
        ("active", 2, {"attempt": 2, "pct": 50}),
        ("succeeded", 2, None),
    ]
    assert not any(e.resync for e in events)  # all from the log, in order
    ids = [e.event_id for e in events]
    assert all(i is not None for i in ids) and ids == sorted(ids)
    assert all((e.id, e.kind, e.queue, e.batch_id) == (job, "steps", "default", None) for e in events)


def test_durable_reread_heals_missing_notifications(dsn: str, conn: psycopg.Connection[Any]) -> None:
    """A queue with status_events='none' logs nothing at all: a subscriber watching its jobs still sees where
    they end, through the periodic re-read of durable status."""
    conn.execute("SELECT pgjobs.configure_queue('silent', status_events => 'none')")
    a = enqueue(conn, "x", queue="silent")
    b = enqueue(conn, "x", queue="silent")
    events: list[StatusEvent] = []

    async def main() -> None:
        async with AsyncClient(dsn) as client:
            with anyio.fail_after(30):
                async for ev in client.subscribe(job_ids=[a, b], resync_interval=0.1, poll_interval=0.1):
                    events.append(ev)
                    if len(events) == 2:
                        i, tok = claim_one(conn, "silent")
                        conn.execute("SELECT pgjobs.complete(%s, %s, '\"ok\"')", [i, tok])
                        i, tok = claim_one(conn, "silent")
                        conn.execute("SELECT pgjobs.fail(%s, %s, 'bad', now())", [i, tok])
                        i, tok = claim_one(conn, "silent")
                        conn.execute("SELECT pgjobs.dead_letter(%s, %s, 'worse')", [i, tok])

    anyio.run(main)
    assert {e.id: e.state for e in events if e.terminal} == {a: JobState.SUCCEEDED, b: JobState.FAILED}
    assert all(e.resync for e in events)


def test_stream_survives_a_terminated_connection(dsn: str, conn: psycopg.Connection[Any]) -> None:
    job = enqueue(conn, "x")
    events: list[StatusEvent] = []

    def listen_pid() -> int | None:
        row = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'pgjobs-subscribe'"
            " AND datname = current_database()"
        ).fetchone()
        return None if row is None else int(row[0])

    async def main() -> None:
        async with AsyncClient(dsn) as client:
            with anyio.fail_after(30):
                async for ev in client.subscribe(job_ids=[job], resync_interval=30):
                    events.append(ev)
                    if len(events) == 1:
                        old = wait_for(listen_pid, what="the subscriber's connection")
                        conn.execute("SELECT pg_terminate_backend(%s)", [old])
                        # While it reconnects, the job runs: whatever hint is lost, the read from the cursor on
                        # reconnect delivers every event.
                        i, tok = claim_one(conn)
                        conn.execute("SELECT pgjobs.complete(%s, %s)", [i, tok])

    anyio.run(main)
    assert [e.state for e in events] == [JobState.PENDING, JobState.ACTIVE, JobState.SUCCEEDED]
    assert not any(e.resync for e in events)


def test_filters_by_queue_kind_and_batch(dsn: str, conn: psycopg.Connection[Any]) -> None:
    by_queue: list[StatusEvent] = []
    by_kind: list[StatusEvent] = []
    by_batch: list[StatusEvent] = []
    rows = conn.execute(
        "SELECT id, batch_id FROM pgjobs.enqueue_many(%s, as_batch => true)",
        [Jsonb([{"kind": "member", "queue": "bq"}, {"kind": "member", "queue": "bq"}])],
    ).fetchall()
    batch = rows[0][1]
    members = {r[0] for r in rows}

    async def collect(client: AsyncClient, out: list[StatusEvent], n: int, filters: dict[str, Any]) -> None:
        async for ev in client.subscribe(**filters):
            out.append(ev)
            if len(out) >= n:
                return

    async def main() -> None:
        async with AsyncClient(dsn) as client:
            with anyio.fail_after(30):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(collect, client, by_queue, 3, {"queue": "q1"})
                    tg.start_soon(collect, client, by_kind, 3, {"kinds": ["k2"]})
                    tg.start_soon(collect, client, by_batch, 6, {"batch_id": batch})
                    await listening(conn, 3)
                    for q, k in (("q1", "k1"), ("q2", "k2"), ("q3", "k3")):
                        enqueue(conn, k, queue=q)
                        i, tok = claim_one(conn, q)
                        conn.execute("SELECT pgjobs.complete(%s, %s)", [i, tok])
                    for _ in members:
                        i, tok = claim_one(conn, "bq")
                        conn.execute("SELECT pgjobs.complete(%s, %s)", [i, tok])

    anyio.run(main)

    assert [(e.queue, e.state.value) for e in by_queue] == [("q1", "pending"), ("q1", "active"), ("q1", "succeeded")]
    assert [(e.kind, e.state.value) for e in by_kind] == [("k2", "pending"), ("k2", "active"), ("k2", "succeeded")]
    # the batch stream starts with its members' history, then follows them
    assert [e.state.value for e in by_batch[:2]] == ["pending", "pending"] and not by_batch[0].resync
    assert {e.id for e in by_batch} == members and all(e.batch_id == batch for e in by_batch)
    assert sorted(e.state.value for e in by_batch[2:]) == ["active", "active", "succeeded", "succeeded"]


def test_stream_of_finished_or_unknown_jobs_ends_at_once(dsn: str, conn: psycopg.Connection[Any]) -> None:
    job = enqueue(conn, "x")
    i, tok = claim_one(conn)
    conn.execute("SELECT pgjobs.complete(%s, %s, '42')", [i, tok])
    events: list[StatusEvent] = []

    async def main() -> None:
        async with AsyncClient(dsn) as client:
            with anyio.fail_after(10):
                async for ev in client.subscribe(job_ids=[job, 10_000_000]):
                    events.append(ev)
                async for ev in client.subscribe(job_ids=[]):
                    events.append(ev)

    anyio.run(main)
    assert shape(events) == [("pending", 0, None), ("active", 1, None), ("succeeded", 1, None)]  # its history


def test_watched_job_outside_the_queue_filter_does_not_hold_the_stream(dsn: str, conn: psycopg.Connection[Any]) -> None:
    inside = enqueue(conn, "x", queue="a")
    outside = enqueue(conn, "x", queue="b")
    i, tok = claim_one(conn, "a")
    conn.execute("SELECT pgjobs.complete(%s, %s)", [i, tok])
    events: list[StatusEvent] = []

    async def main() -> None:
        async with AsyncClient(dsn) as client:
            with anyio.fail_after(10):
                async for ev in client.subscribe(job_ids=[inside, outside], queue="a"):
                    events.append(ev)

    anyio.run(main)
    assert [(e.id, e.state.value) for e in events] == [(inside, "pending"), (inside, "active"), (inside, "succeeded")]


def collect_until(dsn: str, n: int, timeout: float = 30, **kwargs: Any) -> list[StatusEvent]:
    """Runs a subscription in a thread-free way: returns its first ``n`` events (fails after ``timeout``)."""
    out: list[StatusEvent] = []

    async def main() -> None:
        async with AsyncClient(dsn) as client:
            with anyio.fail_after(timeout):
                async for ev in client.subscribe(**kwargs):
                    out.append(ev)
                    if len(out) >= n:
                        return

    anyio.run(main)
    return out


def test_forged_hints_neither_end_the_stream_nor_change_it(dsn: str, conn: psycopg.Connection[Any]) -> None:
    job = enqueue(conn, "x")
    events: list[StatusEvent] = []

    async def main() -> None:
        async with AsyncClient(dsn) as client:
            with anyio.fail_after(30):
                async for ev in client.subscribe(job_ids=[job], poll_interval=30):
                    events.append(ev)
                    if len(events) == 1:
                        lie = f'[{{"id": {job}, "state": "succeeded"}}]'
                        for forged in ('{"event_id": 99999999}', lie, "garbage", '{"event_id": 0}', ""):
                            conn.execute("SELECT pg_notify('pgjobs_status', %s)", [forged])
                        await anyio.sleep(0.3)
                        i, tok = claim_one(conn)
                        conn.execute("SELECT pgjobs.complete(%s, %s)", [i, tok])

    anyio.run(main)
    assert [e.state.value for e in events] == ["pending", "active", "succeeded"]


def test_no_hint_at_all_costs_latency_never_an_event(dsn: str, conn: psycopg.Connection[Any]) -> None:
    """With every hint dropped (the follower mark removed before each transition, so writers send none, and
    the LISTEN connection killed in between), the poll fallback still delivers every event, once, in order."""
    jobs = [enqueue(conn, "x") for _ in range(3)]
    events: list[StatusEvent] = []

    def listen_pids() -> list[int]:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'pgjobs-subscribe'"
            " AND datname = current_database()"
        ).fetchall()
        return [int(r[0]) for r in rows]

    async def main() -> None:
        async with AsyncClient(dsn) as client:
            with anyio.fail_after(60):
                async for ev in client.subscribe(job_ids=jobs, poll_interval=0.2):
                    events.append(ev)
                    if len(events) == 3:
                        for _ in jobs:
                            conn.execute("TRUNCATE pgjobs.stream_followers")
                            for pid in listen_pids():
                                conn.execute("SELECT pg_terminate_backend(%s)", [pid])
                            i, tok = claim_one(conn)
                            conn.execute("TRUNCATE pgjobs.stream_followers")
                            conn.execute("SELECT pgjobs.complete(%s, %s)", [i, tok])

    anyio.run(main)
    assert sorted((e.id, e.state.value) for e in events) == sorted(
        [(j, s) for j in jobs for s in ("pending", "active", "succeeded")]
    )
    ids = [e.event_id for e in events]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)


def test_rolled_back_events_never_appear_and_a_long_transaction_arrives_when_it_commits(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    queue_events: list[StatusEvent] = []
    long_tx = psycopg.connect(dsn)
    try:

        async def main() -> None:
            async with AsyncClient(dsn) as client:
                with anyio.fail_after(30):
                    async for ev in client.subscribe(queue="watched"):
                        queue_events.append(ev)
                        if ev.kind == "flowing" and len([e for e in queue_events if e.kind == "flowing"]) == 1:
                            long_tx.commit()
                        if ev.kind == "held":
                            return

        async def produce() -> None:
            await anyio.sleep(0.5)  # subscribed
            long_tx.execute("SELECT pgjobs.enqueue('held', queue => 'watched')")  # left open
            with psycopg.connect(dsn) as doomed:
                doomed.execute("SELECT pgjobs.enqueue('doomed', queue => 'watched')")
                doomed.rollback()
            enqueue(conn, "flowing", queue="watched")

        async def both() -> None:
            async with anyio.create_task_group() as tg:
                tg.start_soon(main)
                tg.start_soon(produce)

        anyio.run(both)
    finally:
        long_tx.close()
    assert [e.kind for e in queue_events] == ["flowing", "held"]
    assert queue_events[1].event_id is not None and queue_events[0].event_id is not None
    assert queue_events[1].event_id > queue_events[0].event_id


def test_a_subscriber_resumes_after_its_cursor(dsn: str, conn: psycopg.Connection[Any]) -> None:
    first = collect_until(dsn, 1, job_ids=[enqueue(conn, "a")])
    cursor = first[-1].event_id
    assert cursor is not None
    later = enqueue(conn, "b")
    resumed = collect_until(dsn, 1, after_id=cursor)
    assert [(e.id, e.kind, e.state.value) for e in resumed] == [(later, "b", "pending")]


def test_every_event_of_concurrent_producers_and_workers_arrives_in_order_across_reconnects(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    """Four producers (single enqueues, bulk enqueues, multi-call transactions) and two workers (claim and
    complete_many) race on their own connections while one subscriber follows the queue and its connection is
    killed twice: it gets every event exactly once, in event_id order, each job's in transition order, and each
    producer's jobs in the order it enqueued them."""
    producers, per_producer, queue = 4, 60, "race"
    total_jobs = producers * per_producer
    events: list[StatusEvent] = []
    enqueued: list[list[int]] = [[] for _ in range(producers)]
    kills: list[tuple[int, int]] = []  # (connections killed, events read by then)
    stop_workers = False

    def produce(p: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            made = 0
            while made < per_producer:
                time.sleep(0.003)  # the stream lasts long enough to be cut twice
                if made % 3 == 0:
                    enqueued[p].append(enqueue(c, f"p{p}", queue))
                    made += 1
                elif made % 3 == 1:
                    rows = c.execute(
                        "SELECT id FROM pgjobs.enqueue_many(%s)", [Jsonb([{"kind": f"p{p}", "queue": queue}] * 2)]
                    ).fetchall()
                    enqueued[p] += [int(r[0]) for r in rows]
                    made += len(rows)
                else:
                    with c.transaction():
                        enqueued[p] += [enqueue(c, f"p{p}", queue) for _ in range(2)]
                    made += 2

    def work(w: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            while not stop_workers:
                rows = c.execute(
                    "SELECT id, lease_token FROM pgjobs.claim(%s, ARRAY[%s], 7)", [f"w{w}", queue]
                ).fetchall()
                if rows:
                    c.execute(
                        "SELECT pgjobs.complete_many(%s::bigint[], %s::uuid[])",
                        [[r[0] for r in rows], [r[1] for r in rows]],
                    )

    def subscriber_pids() -> list[int]:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'pgjobs-subscribe'"
            " AND datname = current_database()"
        ).fetchall()
        return [int(r[0]) for r in rows]

    async def follow() -> None:
        async with AsyncClient(dsn) as client:
            async for ev in client.subscribe(queue=queue):
                events.append(ev)
                if sum(1 for e in events if e.state is JobState.SUCCEEDED) == total_jobs:
                    return

    async def race() -> None:
        nonlocal stop_workers
        await listening(conn, 1)
        async with anyio.create_task_group() as tg:
            for p in range(producers):
                tg.start_soon(anyio.to_thread.run_sync, produce, p)
            for w in range(2):
                tg.start_soon(anyio.to_thread.run_sync, work, w)
            for share in (1, 2):  # kill the subscriber's connection twice mid-stream, while the others go on
                while len(events) < share * total_jobs:  # a third, then two thirds of the events read
                    await anyio.sleep(0.002)
                pids = subscriber_pids()
                for pid in pids:
                    conn.execute("SELECT pg_terminate_backend(%s)", [pid])
                kills.append((len(pids), len(events)))
            while sum(len(e) for e in enqueued) < total_jobs or conn.execute(
                "SELECT EXISTS (SELECT 1 FROM pgjobs.jobs WHERE queue = %s AND state <> 'succeeded')", [queue]
            ).fetchone() == (True,):
                await anyio.sleep(0.05)
            stop_workers = True

    async def main() -> None:
        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                tg.start_soon(follow)
                tg.start_soon(race)

    anyio.run(main)
    assert [k for k, _ in kills] == [1, 1] and all(n < 3 * total_jobs for _, n in kills)
    ids = [e.event_id for e in events]
    assert all(i is not None for i in ids)
    assert ids == sorted(ids) and len(set(ids)) == len(ids)  # in order, none twice
    per_job: dict[int, list[str]] = {}
    for e in events:
        per_job.setdefault(e.id, []).append(e.state.value)
    assert set(per_job) == {j for p in enqueued for j in p}
    assert all(states == ["pending", "active", "succeeded"] for states in per_job.values())
    pending_order = [e.id for e in events if e.state is JobState.PENDING]
    for p in range(producers):
        mine = set(enqueued[p])
        assert [j for j in pending_order if j in mine] == enqueued[p]
    assert not any(e.resync for e in events)

    async def reread() -> list[StatusEvent]:  # the same events, one page of read_events (StatusEvent's __init__)
        async with AsyncClient(dsn) as client:
            return await client.read_events(after_id=ids[0] - 1, max_rows=10 * len(ids), queue=queue)

    assert anyio.run(reread) == events


def test_forged_hints_produce_no_event_on_a_queue_stream(dsn: str, conn: psycopg.Connection[Any]) -> None:
    """Any role can NOTIFY pgjobs_status: hints of every shape, including ones naming a job and a state, make the
    subscriber read the log and nothing more. The first event it yields is the one real transition."""
    events: list[StatusEvent] = []

    async def main() -> None:
        async with AsyncClient(dsn) as client:
            stream = client.subscribe(queue="forged")

            async def forge() -> None:
                await listening(conn, 1)
                for forged in (
                    '{"event_id": 99999999, "pending": true}',
                    '[{"id": 1, "state": "succeeded", "queue": "forged", "kind": "x", "attempt": 1}]',
                    '{"id": 1, "state": "failed", "queue": "forged"}',
                    "garbage",
                    "",
                ):
                    conn.execute("SELECT pg_notify('pgjobs_status', %s)", [forged])
                await anyio.sleep(0.3)  # read, each of them
                enqueue(conn, "real", queue="forged")

            with anyio.fail_after(30):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(forge)
                    async for ev in stream:
                        events.append(ev)
                        break

    anyio.run(main)
    assert [(e.kind, e.state.value) for e in events] == [("real", "pending")]


def test_a_follower_far_behind_takes_its_backlog_a_page_at_a_time(dsn: str, conn: psycopg.Connection[Any]) -> None:
    """A live stream reads one page (1,000 events) and hands it over before it reads the next, so a
    subscriber resuming far behind holds a page, not its backlog; across the pages every event arrives once,
    in order, for a queue's stream and for a batch's (whose start replays the history whole, then resyncs)."""
    from pgjobs.client.stream import _PAGE, _Stream

    row = conn.execute("SELECT coalesce((SELECT newest_id FROM pgjobs.stream_head()), 0)").fetchone()
    assert row is not None
    head = int(row[0])
    n = 2 * _PAGE + 500
    rows = conn.execute(
        "SELECT id, batch_id FROM pgjobs.enqueue_many(%s, as_batch => true)",
        [Jsonb([{"kind": "paged", "queue": "paged"}] * n)],
    ).fetchall()
    ids = [int(r[0]) for r in rows]
    batch = int(rows[0][1])

    async def pages() -> list[int]:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
            st = _Stream(None, None, "paged", None, head)
            sizes = []
            for _ in range(2):
                sizes.append(len(await st.read(c)))
                assert st.last_page == _PAGE
            sizes.append(len(await st.read(c, drain=True)))
            return sizes

    assert anyio.run(pages) == [_PAGE, _PAGE, 500]
    by_queue = collect_until(dsn, n, queue="paged", after_id=head)
    assert [e.id for e in by_queue] == ids
    assert [e.event_id for e in by_queue] == sorted({e.event_id for e in by_queue})
    by_batch = collect_until(dsn, n, batch_id=batch)
    assert [e.id for e in by_batch] == ids and not any(e.resync for e in by_batch)

"""The thin Python client: typed results, SQLSTATE -> exception mapping, ``conn=`` joining the caller's
transaction. The sync and the async client run the same scenario."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg
import pytest
from conftest import ConnectFactory

import pgjobs
from pgjobs import (
    AsyncClient,
    ClaimedJob,
    Client,
    Enqueued,
    EnqueuedSpec,
    GraphError,
    InvalidArgument,
    InvalidState,
    Job,
    JobNotFound,
    JobState,
    JobStatus,
    PgJobsError,
    QueueFull,
    QueueSettings,
    QueueStat,
    WorkerInfo,
)
from pgjobs.errors import translate


@pytest.mark.smoke
def test_sync_client_round_trip_with_typed_results(dsn: str) -> None:
    with Client(dsn) as client:
        e = client.enqueue("email", {"to": "a@example.com"}, queue="mail", priority=-1, unique_key="u1", meta={"t": 1})
        assert isinstance(e, Enqueued) and e.created is True and e.state is JobState.PENDING
        assert client.enqueue("email", {}, queue="mail", unique_key="u1") == Enqueued(e.id, False, JobState.PENDING)

        specs = client.enqueue_many([{"kind": "a", "ref": "x"}, {"kind": "b", "queue": "mail"}])
        assert all(isinstance(s, EnqueuedSpec) for s in specs) and [s.ref for s in specs] == ["x", None]

        claimed = client.claim("w1", queues=["mail"], max_jobs=5, lease=60)
        assert [type(c) for c in claimed] == [ClaimedJob, ClaimedJob]
        first = claimed[0]
        assert first.id == e.id and first.payload == {"to": "a@example.com"} and first.meta == {"t": 1}
        assert isinstance(first.lease_token, UUID) and isinstance(first.lease_expires_at, datetime)
        assert first.attempt == 1

        assert client.renew_lease(first.id, first.lease_token, timedelta(minutes=5)) is True
        assert client.checkpoint(first.id, first.lease_token, {"step": 1}) is True
        assert client.progress(first.id, first.lease_token, {"pct": 50}) is True
        assert client.complete(first.id, first.lease_token, {"sent": True}) is True
        assert client.complete(first.id, first.lease_token) is False

        second = claimed[1]
        assert client.fail(second.id, second.lease_token, "smtp down", retry_at=datetime.now(UTC)) is JobState.PENDING
        assert client.fail(second.id, second.lease_token, "stale") is None
        again = client.claim("w1", queues=["mail"])[0]
        assert client.release(again.id, again.lease_token) is True
        again = client.claim("w1", queues=["mail"])[0]
        assert client.dead_letter(again.id, again.lease_token, "poison") is True
        assert client.retry(again.id) is True

        got = client.claim("w1", max_jobs=1)
        assert client.complete_many([g.id for g in got], [g.lease_token for g in got]) == 1

        st = client.job_status(e.id)
        assert isinstance(st, JobStatus) and st.state is JobState.SUCCEEDED and st.result == {"sent": True}
        assert st.depends_on == [] and st.checkpoint == {"step": 1}
        assert client.job_status(10**9) is None

        stats = client.stats()
        assert all(isinstance(s, QueueStat) and isinstance(s.state, JobState) for s in stats)
        assert {(s.queue, s.state): s.jobs for s in stats}[("mail", JobState.SUCCEEDED)] == 1

        jobs = client.list_jobs(queue="mail", search="EMAIL")
        assert [type(j) for j in jobs] == [Job] and jobs[0].id == e.id and jobs[0].state is JobState.SUCCEEDED
        assert [j.id for j in client.list_jobs(state=JobState.PENDING)] == [specs[1].id]  # the retried one

        settings = client.configure_queue("mail", max_length=10, noisy_share=0.25, status_events="terminal")
        assert isinstance(settings, QueueSettings)
        assert (settings.max_length, settings.noisy_share, settings.status_events) == (10, 0.25, "terminal")

        client.worker_heartbeat("w1", {"host": "h"})
        workers = client.list_workers()
        assert [type(w) for w in workers] == [WorkerInfo] and workers[0].meta == {"host": "h"}
        assert client.reap_workers(3600) == 0

        assert client.cancel(specs[0].id) is False  # succeeded
        assert client.cancel(specs[1].id) is True
        assert client.delete(specs[1].id) is True
        assert client.purge(succeeded_before=0, failed_before=0) >= 0


@pytest.mark.smoke
def test_async_client_round_trip(dsn: str) -> None:
    async def scenario() -> None:
        async with AsyncClient(dsn) as client:
            e = await client.enqueue("k", {"n": 1}, unique_key="a")
            assert e == Enqueued(e.id, True, JobState.PENDING)
            assert (await client.enqueue("k", unique_key="a")).created is False
            (c,) = await client.claim("aw", max_jobs=3, kind_limits={"k": 1})
            assert isinstance(c, ClaimedJob) and c.payload == {"n": 1}
            assert await client.complete(c.id, c.lease_token, [1]) is True
            st = await client.job_status(e.id)
            assert st is not None and st.state is JobState.SUCCEEDED and st.result == [1]
            assert [j.id for j in await client.list_jobs(search="K")] == [e.id]
            with pytest.raises(JobNotFound):
                await client.cancel(424242)
            with pytest.raises(InvalidArgument):
                await client.claim("aw", max_jobs=0)
            with pytest.raises(InvalidState):
                await client.delete((await client.enqueue("k2")).id)

    asyncio.run(scenario())


def test_sync_client_maps_every_sqlstate_to_its_exception(dsn: str) -> None:
    with Client(dsn) as client:
        client.configure_queue("tiny", max_length=1)
        client.enqueue("k", queue="tiny")
        with pytest.raises(QueueFull) as full:
            client.enqueue("k", queue="tiny")
        assert full.value.sqlstate == "PJ001" and "tiny" in str(full.value)
        assert isinstance(full.value.__cause__, psycopg.Error)
        with pytest.raises(InvalidArgument) as bad:
            client.enqueue("")
        assert bad.value.sqlstate == "PJ002" and "kind" in str(bad.value)
        with pytest.raises(JobNotFound) as missing:
            client.retry(55555)
        assert missing.value.sqlstate == "PJ003" and "55555" in str(missing.value)
        pending = client.enqueue("k").id
        with pytest.raises(InvalidState) as state:
            client.retry(pending)
        assert state.value.sqlstate == "PJ004" and str(pending) in str(state.value)
        for exc in (full.value, bad.value, missing.value, state.value):
            assert isinstance(exc, PgJobsError)


@pytest.mark.parametrize(
    ("code", "cls"),
    [("PJ001", QueueFull), ("PJ002", InvalidArgument), ("PJ003", JobNotFound), ("PJ004", InvalidState),
     ("PJ005", GraphError)],
)  # fmt: skip
def test_translate_maps_real_server_errors(conn: psycopg.Connection[Any], code: str, cls: type[PgJobsError]) -> None:
    with pytest.raises(psycopg.Error) as info:
        conn.execute(f"DO $$ BEGIN RAISE EXCEPTION USING ERRCODE = '{code}', MESSAGE = 'bad value 42'; END $$")
    exc = translate(info.value)
    assert type(exc) is cls and exc.sqlstate == code and str(exc) == "bad value 42"  # type: ignore[attr-defined]
    # any other error is not ours and passes through unchanged
    with pytest.raises(psycopg.Error) as other:
        conn.execute("SELECT 1 / 0")
    assert translate(other.value) is other.value


@pytest.mark.smoke
def test_conn_joins_the_callers_transaction(dsn: str, connect: ConnectFactory) -> None:
    with Client(dsn) as client:
        mine = connect(autocommit=False)
        e = client.enqueue("in_tx", conn=mine)
        assert client.job_status(e.id) is None  # other connections do not see it yet
        mine.rollback()
        assert client.job_status(e.id) is None  # rolled back: no job
        assert client.list_jobs(kind="in_tx") == []

        e = client.enqueue("in_tx", conn=mine)
        specs = client.enqueue_many([{"kind": "in_tx"}], conn=mine)
        mine.commit()
        assert {j.id for j in client.list_jobs(kind="in_tx")} == {e.id, specs[0].id}

        # a failed call inside the caller's transaction surfaces as our exception, and the caller rolls back
        with pytest.raises(InvalidArgument):
            client.enqueue("in_tx", conn=mine)
            client.enqueue("", conn=mine)
        mine.rollback()
        assert len(client.list_jobs(kind="in_tx")) == 2


def test_async_conn_joins_the_callers_transaction(dsn: str) -> None:
    async def scenario() -> None:
        async with AsyncClient(dsn) as client, await psycopg.AsyncConnection.connect(dsn) as mine:
            e = await client.enqueue("atx", conn=mine)
            assert await client.job_status(e.id) is None
            await mine.rollback()
            assert await client.list_jobs(kind="atx") == []
            e = await client.enqueue("atx", conn=mine)
            await mine.commit()
            assert [j.id for j in await client.list_jobs(kind="atx")] == [e.id]

    asyncio.run(scenario())


def test_client_on_a_shared_pool(dsn: str) -> None:
    from psycopg_pool import ConnectionPool

    with ConnectionPool(dsn, min_size=1, max_size=2, kwargs={"autocommit": True}) as pool:
        client = Client(pool=pool)
        assert client.enqueue("k").created is True
        client.close()  # the pool is the caller's: still open
        assert client.stats()[0].jobs == 1


def test_the_package_exports_the_client_api() -> None:
    for name in ("Client", "AsyncClient", "QueueFull", "InvalidArgument", "JobNotFound", "InvalidState", "GraphError",
                 "JobState", "ClaimedJob", "JobStatus"):  # fmt: skip
        assert hasattr(pgjobs, name), name


def test_sync_and_async_clients_offer_the_same_calls() -> None:
    """Every call of the foundation mixins exists on both clients, async on AsyncClient, with the same parameters."""
    import inspect

    from pgjobs.client.admin import AdminOps
    from pgjobs.client.claim import ClaimOps
    from pgjobs.client.enqueue import EnqueueOps
    from pgjobs.client.lifecycle import LifecycleOps
    from pgjobs.client.status import StatusOps
    from pgjobs.client.workers import WorkerOps

    names = {n for ops in (EnqueueOps, ClaimOps, LifecycleOps, AdminOps, StatusOps, WorkerOps) for n in vars(ops)}
    names = {n for n in names if not n.startswith("_")}
    assert {"enqueue", "claim", "complete_many", "cancel", "list_jobs", "reap_workers"} <= names
    for name in names:
        method = getattr(AsyncClient, name)
        assert inspect.iscoroutinefunction(method), f"AsyncClient.{name} is not async"
        s_params = list(inspect.signature(getattr(Client, name)).parameters)
        assert list(inspect.signature(method).parameters) == s_params, name

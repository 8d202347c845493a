"""Workers: worker_heartbeat, list_workers, reap_workers."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest
from conftest import ConnectFactory

from tests.helpers.foundation import call, claim, claim_one, drain, enqueue, job, listen, payloads, scalar

Conn = psycopg.Connection[Any]


def silence(conn: Conn, worker: str, age: str = "10 minutes") -> None:
    """As if ``worker`` had not been heard from for ``age``."""
    conn.execute("UPDATE pgjobs.workers SET last_seen = now() - %s::interval WHERE id = %s", [age, worker])


@pytest.mark.smoke
def test_heartbeat_registers_and_refreshes_a_worker(conn: Conn) -> None:
    call(conn, "worker_heartbeat", worker="w1", meta={"host": "h", "pid": 1})
    rows = call(conn, "list_workers")
    assert [(r["id"], r["meta"]) for r in rows] == [("w1", {"host": "h", "pid": 1})]
    first_seen = rows[0]["last_seen"]
    silence(conn, "w1")
    call(conn, "worker_heartbeat", worker="w1", meta={"host": "h", "pid": 1, "active": 3})
    (row,) = call(conn, "list_workers")
    assert row["last_seen"] >= first_seen and row["meta"]["active"] == 3


def test_heartbeat_with_null_meta_keeps_the_meta(conn: Conn) -> None:
    call(conn, "worker_heartbeat", worker="w1", meta={"host": "h"})
    conn.execute("SELECT pgjobs.worker_heartbeat(worker => 'w1', meta => NULL)")
    assert call(conn, "list_workers")[0]["meta"] == {"host": "h"}


@pytest.mark.smoke
def test_reap_workers_forgets_silent_workers_and_frees_their_jobs_at_once(connect: ConnectFactory) -> None:
    conn = connect()
    listener = connect()
    for _ in range(3):
        enqueue(conn, max_attempts=5)
    call(conn, "worker_heartbeat", worker="dead", meta={})
    call(conn, "worker_heartbeat", worker="alive", meta={})
    dead_jobs = claim(conn, "dead", max_jobs=2, lease=timedelta(hours=1))
    alive_job = claim_one(conn, "alive", lease=timedelta(hours=1))
    silence(conn, "dead")
    listen(listener, "pgjobs_wake")
    assert scalar(conn, "reap_workers", stale_after=timedelta(minutes=1)) == 1
    assert [r["id"] for r in call(conn, "list_workers")] == ["alive"]
    assert payloads(drain(listener), "pgjobs_wake") == ["default"]
    # the dead worker's jobs are claimable now, long before their hour-long lease ends
    again = claim(conn, "rescuer", max_jobs=5)
    assert sorted(g["id"] for g in again) == sorted(d["id"] for d in dead_jobs)
    assert all(g["attempt"] == 2 for g in again)
    assert job(conn, alive_job["id"])["leased_by"] == "alive"
    # the dead worker's tokens no longer hold anything
    for d in dead_jobs:
        assert scalar(conn, "complete", id=d["id"], lease_token=d["lease_token"]) is False
    assert scalar(conn, "reap_workers", stale_after=timedelta(minutes=1)) == 0


def test_reap_workers_counts_every_forgotten_worker(conn: Conn) -> None:
    for w in ("a", "b", "c", "d"):
        call(conn, "worker_heartbeat", worker=w, meta={})
    silence(conn, "a")
    silence(conn, "b")
    silence(conn, "c", "5 seconds")
    assert scalar(conn, "reap_workers", stale_after=timedelta(seconds=30)) == 2
    assert sorted(r["id"] for r in call(conn, "list_workers")) == ["c", "d"]
    # 0: everyone not seen in this very transaction
    assert scalar(conn, "reap_workers", stale_after=timedelta(0)) == 2
    assert call(conn, "list_workers") == []


def test_a_slow_worker_that_was_reaped_can_finish_until_someone_reclaims(conn: Conn) -> None:
    enqueue(conn)
    call(conn, "worker_heartbeat", worker="slow", meta={})
    c = claim_one(conn, "slow", lease=timedelta(hours=1))
    silence(conn, "slow")
    assert scalar(conn, "reap_workers", stale_after=timedelta(minutes=1)) == 1
    assert scalar(conn, "complete", id=c["id"], lease_token=c["lease_token"]) is True
    assert claim(conn) == []

"""Reading state: job_status, stats, list_jobs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from tests.helpers.foundation import call, claim_one, enqueue, scalar

Conn = psycopg.Connection[Any]


@pytest.mark.smoke
def test_job_status_returns_the_row_and_its_dependencies(conn: Conn) -> None:
    jid = enqueue(conn, "k", payload={"a": 1}, unique_key="u", meta={"m": 1})["id"]
    rows = call(conn, "job_status", id=jid)
    assert len(rows) == 1
    st = rows[0]
    assert (st["id"], st["kind"], st["state"], st["payload"], st["unique_key"], st["meta"]) == (
        jid,
        "k",
        "pending",
        {"a": 1},
        "u",
        {"m": 1},
    )
    assert st["depends_on"] == []
    for column in ("attempt", "max_attempts", "lease_token", "checkpoint", "progress", "result", "errors", "batch_id"):
        assert column in st


def test_job_status_follows_the_job(conn: Conn) -> None:
    jid = enqueue(conn)["id"]
    c = claim_one(conn)
    scalar(conn, "progress", id=jid, lease_token=c["lease_token"], progress={"p": 50})
    st = call(conn, "job_status", id=jid)[0]
    assert (st["state"], st["attempt"], st["progress"], st["lease_token"]) == ("active", 1, {"p": 50}, c["lease_token"])
    scalar(conn, "complete", id=jid, lease_token=c["lease_token"], result=[1, 2])
    st = call(conn, "job_status", id=jid)[0]
    assert (st["state"], st["result"]) == ("succeeded", [1, 2])


def test_job_status_of_an_unknown_id_is_no_row(conn: Conn) -> None:
    assert call(conn, "job_status", id=123456) == []


@pytest.mark.smoke
def test_stats_counts_jobs_per_queue_and_state(conn: Conn) -> None:
    for _ in range(3):
        enqueue(conn, queue="a")
    enqueue(conn, queue="a", run_at=datetime.now(UTC) + timedelta(hours=1))
    enqueue(conn, queue="b")
    c = claim_one(conn, queues=["b"])
    scalar(conn, "complete", id=c["id"], lease_token=c["lease_token"])
    enqueue(conn, queue="b")
    got = {(r["queue"], r["state"]): r["jobs"] for r in call(conn, "stats")}
    assert got == {("a", "pending"): 3, ("a", "scheduled"): 1, ("b", "succeeded"): 1, ("b", "pending"): 1}
    assert all(isinstance(v, int) for v in got.values())


def test_stats_of_an_empty_system(conn: Conn) -> None:
    assert call(conn, "stats") == []


def _ids(rows: list[dict[str, Any]]) -> list[int]:
    return [r["id"] for r in rows]


@pytest.mark.smoke
def test_list_jobs_newest_first_with_filters(conn: Conn) -> None:
    a = enqueue(conn, "SendEmail", queue="mail")["id"]
    b = enqueue(conn, "resize_image", queue="img", unique_key="Photo-42")["id"]
    c = enqueue(conn, "send_sms", queue="mail")["id"]
    d = enqueue(conn, "cleanup", queue="img", run_at=datetime.now(UTC) + timedelta(hours=1))["id"]
    assert _ids(call(conn, "list_jobs")) == [d, c, b, a]
    assert _ids(call(conn, "list_jobs", queue="mail")) == [c, a]
    assert _ids(call(conn, "list_jobs", state="scheduled")) == [d]
    assert _ids(call(conn, "list_jobs", kind="send_sms")) == [c]
    assert _ids(call(conn, "list_jobs", kind="send")) == []  # kind is exact, search is fuzzy
    # search: kind or unique_key, case-insensitively
    assert _ids(call(conn, "list_jobs", search="SEND")) == [c, a]
    assert _ids(call(conn, "list_jobs", search="photo")) == [b]
    assert _ids(call(conn, "list_jobs", search="image")) == [b]
    assert _ids(call(conn, "list_jobs", search="nothing-like-it")) == []
    assert _ids(call(conn, "list_jobs", search="send", queue="mail", state="pending")) == [c, a]
    assert _ids(call(conn, "list_jobs", search="%")) == []  # no pattern characters


def test_list_jobs_pages(conn: Conn) -> None:
    ids = [enqueue(conn)["id"] for _ in range(7)]
    newest_first = ids[::-1]
    assert _ids(call(conn, "list_jobs", max_rows=3)) == newest_first[:3]
    assert _ids(call(conn, "list_jobs", max_rows=3, skip_rows=3)) == newest_first[3:6]
    assert _ids(call(conn, "list_jobs", max_rows=3, skip_rows=6)) == newest_first[6:]
    assert len(call(conn, "list_jobs")) == 7  # default max_rows 100


def test_list_jobs_default_limit_is_100(conn: Conn) -> None:
    call(conn, "enqueue_many", jobs=[{"kind": "k"} for _ in range(120)])
    assert len(call(conn, "list_jobs")) == 100

"""The end of an active job of a capped queue sends ``pgjobs_wake`` (sql/wakeups.sql, ``_wake_capped``).

A claim that ``max_active`` or ``max_active_per_group`` cut short leaves its worker asleep until it is told;
each call that ends an active job of a capped queue frees room under the cap, so it tells the queue's workers
(one wake per queue per transaction, on commit). An uncapped queue's ends send none (nothing waits on them).
``capped_queues`` names the capped ones among a worker's queues (the in-process side, pgjobs/runtime).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from conftest import ConnectFactory

from tests.helpers.foundation import Conn, call, claim, claim_one, drain, enqueue, listen, payloads, scalar

CAPS: dict[str, dict[str, Any]] = {
    "capped": {"max_active": 1},
    "grouped": {"fair": True, "max_active_per_group": 1},
    "fair": {"fair": True},  # fair without a cap: not capped
}


def _configure(conn: Conn) -> None:
    for queue, settings in CAPS.items():
        call(conn, "configure_queue", queue=queue, **settings)


def test_capped_queues_names_the_queues_with_a_cap(conn: Conn) -> None:
    _configure(conn)
    names = ["plain", "capped", "grouped", "fair", "unknown"]
    assert scalar(conn, "capped_queues", queues=names) == ["capped", "grouped"]
    call(conn, "configure_queue", queue="capped", max_active=0)  # 0 removes the cap
    assert scalar(conn, "capped_queues", queues=names) == ["grouped"]
    assert scalar(conn, "capped_queues", queues=[]) == []


def _later() -> datetime:
    return datetime.now(UTC) + timedelta(hours=1)


# Each call that ends an attempt without making the job claimable now (a job that becomes pending wakes its
# queue anyway): (name, max_attempts of the job, the call on (conn, id, token)).
Ender = Callable[[Conn, int, Any], Any]
ENDS: list[tuple[str, int, Ender]] = [
    ("complete", 5, lambda c, i, t: scalar(c, "complete", id=i, lease_token=t)),
    ("complete_many", 5, lambda c, i, t: scalar(c, "complete_many", ids=[i], lease_tokens=[t])),
    ("fail, retried later", 5, lambda c, i, t: scalar(c, "fail", id=i, lease_token=t, error="e", retry_at=_later())),
    ("fail, out of attempts", 1, lambda c, i, t: scalar(c, "fail", id=i, lease_token=t, error="e")),
    ("dead_letter", 5, lambda c, i, t: scalar(c, "dead_letter", id=i, lease_token=t, error="e")),
    ("release, run later", 5, lambda c, i, t: scalar(c, "release", id=i, lease_token=t, run_at=_later())),
    ("ack_cancel", 5, lambda c, i, t: (scalar(c, "cancel", id=i), scalar(c, "ack_cancel", id=i, lease_token=t))),
]


@pytest.mark.parametrize("queue", ["capped", "grouped", "fair", "plain"])
@pytest.mark.parametrize(("name", "attempts", "end"), ENDS, ids=[e[0] for e in ENDS])
def test_every_end_of_an_active_job_wakes_a_capped_queue_only(
    connect: ConnectFactory, queue: str, name: str, attempts: int, end: Ender
) -> None:
    conn, listener = connect(), connect()
    _configure(conn)
    listen(listener, "pgjobs_wake")
    jid = enqueue(conn, "k", queue=queue, group_key="g", max_attempts=attempts)["id"]
    got = claim_one(conn, queues=[queue])
    assert got["id"] == jid
    drain(listener)  # the enqueue's and the configuration's wakes
    ended = end(conn, jid, got["lease_token"])
    assert ended and (not isinstance(ended, tuple) or all(ended)), f"{name} did not end the attempt"
    assert call(conn, "job_status", id=jid)[0]["state"] in ("succeeded", "failed", "cancelled", "scheduled")
    expected = [queue] if queue in ("capped", "grouped") else []
    assert payloads(drain(listener), "pgjobs_wake") == expected


def test_complete_many_wakes_each_capped_queue_once_on_commit(connect: ConnectFactory) -> None:
    conn, listener = connect(), connect()
    _configure(conn)
    call(conn, "configure_queue", queue="capped", max_active=0)  # no cap while its three jobs are claimed
    listen(listener, "pgjobs_wake")
    for queue in ("capped", "grouped", "plain"):
        for g in ("a", "b", "c"):
            enqueue(conn, "k", queue=queue, group_key=g)
    got = claim(conn, queues=["capped", "grouped", "plain"], max_jobs=9)
    assert len(got) == 9
    call(conn, "configure_queue", queue="capped", max_active=1)  # capped again while its three are active
    drain(listener)
    tx = connect(autocommit=False)
    done = scalar(tx, "complete_many", ids=[g["id"] for g in got], lease_tokens=[g["lease_token"] for g in got])
    assert done == 9
    assert payloads(drain(listener), "pgjobs_wake") == []  # nothing before the commit
    tx.commit()
    assert sorted(payloads(drain(listener), "pgjobs_wake")) == ["capped", "grouped"]

"""Claims through PgBouncer in transaction pooling mode (2 server connections): what a claim takes depends on
its arguments and the tables, never on the server session it lands on (sql/claim.sql, "Floors").

Clients with different queues and kind_limits share the two server sessions all the time, while producers file
jobs of both kinds into both queues (some with a past run_at or a better priority, some from transactions that
stay open a while). Every job is claimed exactly once; after quiescence, no job that some client may take is
left pending. Twice: with plain queues, and with a fair queue and a fair queue capped per group (sql/fair.sql),
the jobs spread over groups and some ungrouped.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from tests.helpers.foundation import call, claim, scalar
from tests.helpers.pgbouncer import Bouncer, pgbouncer_binary, start_pgbouncer

pytestmark = pytest.mark.skipif(
    pgbouncer_binary() is None,
    reason="pgbouncer is not installed (Debian package 'pgbouncer': apt-get install -y pgbouncer)",
)

Conn = psycopg.Connection[Any]
PAST = "2001-02-03T04:05:06Z"
# (queues, kind_limits, max_jobs) of each client: every job (kinds a and b, queues q1 and q2) is some client's
CLIENTS: list[tuple[list[str], dict[str, int] | None, int]] = [
    (["q1"], None, 3),
    (["q1", "q2"], {"a": 2}, 5),
    (["q2"], {"a": 1, "b": 2}, 4),
    (["q1"], {"b": 5}, 5),
    (["q2", "q1"], {"a": 3, "b": 1}, 2),
]


@pytest.fixture
def bouncer(dsn: str, pg_server_dsn: str) -> Iterator[Bouncer]:
    b = start_pgbouncer(pg_server_dsn, dbname=conninfo_to_dict(dsn)["dbname"])
    try:
        yield b
    finally:
        b.stop()


@pytest.mark.parametrize("fair", [False, True], ids=["plain", "fair-and-capped"])
def test_clients_racing_through_a_transaction_pooler_claim_each_job_once_and_leave_none(
    bouncer: Bouncer, dsn: str, fair: bool
) -> None:
    pooled = bouncer.dsn(conninfo_to_dict(dsn)["dbname"])
    if fair:
        with psycopg.connect(dsn, autocommit=True) as direct:
            call(direct, "configure_queue", queue="q1", fair=True)
            call(direct, "configure_queue", queue="q2", fair=True, max_active_per_group=2)

    def connect() -> Conn:
        return psycopg.connect(pooled, autocommit=True, prepare_threshold=None)

    per_producer = 240
    made: list[list[int]] = [[], []]
    claimed: list[list[int]] = [[] for _ in CLIENTS]
    producing = threading.Event()
    stop = threading.Event()
    errors: list[BaseException] = []

    def producer(i: int) -> None:
        try:
            with connect() as p:
                for n in range(per_producer // 8):
                    spec: dict[str, Any] = {"kind": "ab"[(n + i) % 2], "queue": ("q1", "q2")[n % 2]}
                    if n % 5 == 1:
                        spec["run_at"] = PAST
                    if n % 7 == 2:
                        spec["priority"] = -1
                    if fair and n % 9 != 4:
                        spec["group_key"] = f"g{n % 5}"
                    with p.transaction():
                        rows = call(p, "enqueue_many", jobs=[spec] * 8)
                        if n % 6 == 3:
                            stop.wait(0.1)  # a transaction that stays open while claims pass
                    made[i] += [r["id"] for r in rows]
        except BaseException as exc:  # surfaced by the main thread
            errors.append(exc)

    def client(i: int) -> None:
        queues, limits, n = CLIENTS[i]
        extra: dict[str, Any] = {"kind_limits": limits} if limits is not None else {}
        try:
            with connect() as c:
                idle = 0
                while not stop.is_set() and (producing.is_set() or idle < 20):
                    got = claim(c, f"c{i}", queues=queues, max_jobs=n, **extra)
                    idle = 0 if got else idle + 1
                    if got:
                        assert all(g["queue"] in queues for g in got)
                        assert limits is None or all(g["kind"] in limits for g in got)
                        scalar(
                            c, "complete_many", ids=[g["id"] for g in got], lease_tokens=[g["lease_token"] for g in got]
                        )
                        claimed[i] += [g["id"] for g in got]
        except BaseException as exc:
            errors.append(exc)

    producing.set()
    producers = [threading.Thread(target=producer, args=(i,)) for i in range(2)]
    clients = [threading.Thread(target=client, args=(i,)) for i in range(len(CLIENTS))]
    for t in producers + clients:
        t.start()
    for t in producers:
        t.join(120)
    producing.clear()  # quiescence: every client claims until 20 claims in a row found nothing
    for t in clients:
        t.join(120)
    stop.set()
    assert not errors, errors
    everything = [j for c in claimed for j in c]
    assert len(everything) == len(set(everything)), "a job was claimed twice"
    assert sorted(everything) == sorted(j for m in made for j in m), "a job was not claimed"
    with psycopg.connect(dsn, autocommit=True) as direct:
        left = direct.execute("SELECT count(*) FROM pgjobs.jobs WHERE state IN ('pending', 'scheduled')").fetchone()
        assert left == (0,)
        # and the claim's own functions neither write nor read a pgjobs setting (the fair claim reads the
        # transaction's isolation level, to refuse one older than its lock)
        settings = direct.execute(
            "SELECT array_agg(proname) FROM pg_proc WHERE pronamespace = 'pgjobs'::regnamespace"
            " AND (proname IN ('_claim_plan', '_claim_take', '_slots_rotate', '_claim_once', '_claim_routed')"
            "      OR proname LIKE '\\_fair\\_%' OR proname LIKE '\\_cap\\_%')"
            " AND (prosrc LIKE '%set_config(''pgjobs.%' OR prosrc LIKE '%current_setting(''pgjobs.%')"
        ).fetchone()
        assert settings == (None,)

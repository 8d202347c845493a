"""The core suite: pgjobs' SQL hot paths against a bare table doing the least a queue can do.

Every figure of ours is measured in the same run, on the same server, as its bare-table baseline, and
the two take turns so the ratio survives the noise of a shared machine: call by call for enqueue and
enqueue_many, run by run (A/B/A/B, the order flipping every round) for claim + complete. The bare table
(schema ``bench_bare``) is a realistic minimal queue: an identity key, queue, kind, payload, a small
state code, run_at, and one partial index for claiming.

What is measured (all through psycopg with server-side prepared statements, autocommit, one commit per
call, fsync as the server has it):

* enqueue, one per commit: ``pgjobs.enqueue`` vs a single-row INSERT; and the same through the client
  (``AsyncClient.enqueue``, ``Client.enqueue``), and ``Client.enqueue_many`` / ``Client.enqueue_copy`` in
  batches of 1,000 (see :mod:`bench.core_enqueue`).
* enqueue_many, batches of 1,000: ``pgjobs.enqueue_many`` vs a 1,000-row ``INSERT ... SELECT`` from the
  same JSON array (``jsonb_array_elements``), so both sides ship and parse the same document. The bar's
  baseline returns the new ids (``RETURNING id``, fetched), as enqueue_many does and as the single-row
  baseline does; the same INSERT without RETURNING is reported beside it.
* claim + complete at 1, 4 and 16 connections and claim sizes 1, 10 and 100: ``pgjobs.claim`` then
  ``pgjobs.complete`` (size 1) or ``pgjobs.complete_many`` (sizes 10 and 100), vs ``UPDATE ... WHERE id
  IN (SELECT ... FOR UPDATE SKIP LOCKED LIMIT n) RETURNING`` then one ``UPDATE ... WHERE id = ANY``.
  Each run starts from a freshly filled and vacuumed table and lasts a fixed time (or until drained).
* claim latency with 10,000 vs 1,000,000 pending jobs (one claim of one job per call), the deep queue in
  a second database so the two depths take turns: the ratio of the server-side medians (clock_timestamp
  around the call, free of the round trip and of the commit's flush) is the flatness figure.
* throughput with status events on (the default) vs off (``configure_queue(status_events => 'none')``).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from . import core_enqueue
from .common import Figure, alternate, connect, figure, fresh_database, interleaved, median, percentile

QUEUE = "bench"
KIND = "bench.email"
PAYLOAD = json.dumps({"to": "user@example.com", "template": "welcome", "n": 1})

BARE_DDL = """
CREATE SCHEMA IF NOT EXISTS bench_bare;
DROP TABLE IF EXISTS bench_bare.jobs;
CREATE TABLE bench_bare.jobs (
    id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue   text NOT NULL,
    kind    text NOT NULL,
    payload jsonb NOT NULL DEFAULT '{}',
    state   smallint NOT NULL DEFAULT 0,            -- 0 pending, 1 active, 2 done
    run_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX jobs_claim_idx ON bench_bare.jobs (queue, run_at, id) WHERE state = 0;
"""

OURS_ENQUEUE = "SELECT id FROM pgjobs.enqueue(kind => %s, payload => %s::jsonb, queue => %s)"
BARE_INSERT = "INSERT INTO bench_bare.jobs (queue, kind, payload) VALUES (%s, %s, %s::jsonb) RETURNING id"

OURS_ENQUEUE_MANY = "SELECT id FROM pgjobs.enqueue_many(jobs => %s::jsonb)"
BARE_INSERT_MANY = (
    "INSERT INTO bench_bare.jobs (queue, kind, payload)"
    " SELECT coalesce(s ->> 'queue', 'default'), s ->> 'kind', s -> 'payload'"
    " FROM jsonb_array_elements(%s::jsonb) AS s"
)
BARE_INSERT_MANY_IDS = BARE_INSERT_MANY + " RETURNING id"

# The lease token travels as text (the client only hands it back), as the bare side's ids do as numbers:
# neither client pays for objects it does not use.
OURS_CLAIM = (
    "SELECT id, kind, payload, lease_token::text FROM pgjobs.claim(worker => %s, queues => %s::text[], max_jobs => %s)"
)
OURS_COMPLETE = "SELECT pgjobs.complete(id => %s, lease_token => %s::uuid)"
OURS_COMPLETE_MANY = "SELECT pgjobs.complete_many(ids => %s::bigint[], lease_tokens => %s::text[]::uuid[])"
BARE_CLAIM = (
    "UPDATE bench_bare.jobs SET state = 1 WHERE id IN ("
    " SELECT id FROM bench_bare.jobs WHERE state = 0 AND queue = %s AND run_at <= now()"
    " ORDER BY run_at, id LIMIT %s FOR UPDATE SKIP LOCKED)"
    " RETURNING id, kind, payload"
)
BARE_COMPLETE = "UPDATE bench_bare.jobs SET state = 2 WHERE id = ANY (%s::bigint[])"


@dataclass(frozen=True)
class Plan:
    """How much work each measurement does (full run vs --quick)."""

    single_calls: int  # enqueue calls per side
    single_chunk: int  # calls per sample
    bulk_batches: int  # 1,000-job batches per side
    bulk_chunk: int
    claim_seconds: float  # length of one claim+complete run
    claim_rounds: int
    claim_rounds_bar: int  # rounds for claim size 100, the size the bar is set at
    claim_conns: tuple[int, ...]
    claim_sizes: tuple[int, ...]
    events_conns: tuple[int, ...]
    latency_small: int
    latency_large: int
    latency_claims: int


FULL = Plan(
    single_calls=3000,
    single_chunk=250,
    bulk_batches=60,
    bulk_chunk=5,
    claim_seconds=1.5,
    claim_rounds=3,
    claim_rounds_bar=6,
    claim_conns=(1, 4, 16),
    claim_sizes=(1, 10, 100),
    events_conns=(1, 4),
    latency_small=10_000,
    latency_large=1_000_000,
    latency_claims=400,
)
QUICK = Plan(
    single_calls=400,
    single_chunk=100,
    bulk_batches=8,
    bulk_chunk=2,
    claim_seconds=0.5,
    claim_rounds=1,
    claim_rounds_bar=1,
    claim_conns=(1, 4),
    claim_sizes=(1, 100),
    events_conns=(4,),
    latency_small=10_000,
    latency_large=100_000,
    latency_claims=100,
)


def _exec(conn: psycopg.Connection[Any], sql: str, params: Any = None) -> None:
    """Utility statements: several per string, never prepared."""
    conn.execute(sql, params, prepare=False)


def _reset(admin: psycopg.Connection[Any]) -> None:
    _exec(admin, "TRUNCATE pgjobs.jobs, bench_bare.jobs CASCADE")


def _fill(admin: psycopg.Connection[Any], n: int, which: str = "both") -> None:
    """n pending jobs in the benchmark queue, then VACUUM ANALYZE (hint bits set, visibility map,
    statistics), so every run starts from the same clean table."""
    _reset(admin)
    if which in ("both", "ours"):
        _exec(
            admin,
            "INSERT INTO pgjobs.jobs (kind, queue, payload) SELECT %s, %s, %s::jsonb FROM generate_series(1, %s)",
            (KIND, QUEUE, PAYLOAD, n),
        )
    if which in ("both", "bare"):
        _exec(
            admin,
            "INSERT INTO bench_bare.jobs (kind, queue, payload) SELECT %s, %s, %s::jsonb FROM generate_series(1, %s)",
            (KIND, QUEUE, PAYLOAD, n),
        )
    _exec(admin, "VACUUM ANALYZE pgjobs.jobs")
    _exec(admin, "VACUUM ANALYZE bench_bare.jobs")


# --------------------------------------------------------------------------------------------------------
# enqueue


def _call(conn: psycopg.Connection[Any], sql: str, params: tuple[Any, ...], fetch: bool = True) -> Callable[[], None]:
    def run() -> None:
        cur = conn.execute(sql, params)
        if fetch:
            cur.fetchall()

    return run


def _bulk_doc() -> str:
    return json.dumps(
        [{"kind": KIND, "queue": QUEUE, "payload": {"to": f"user{i}@example.com", "n": i}} for i in range(1000)]
    )


# --------------------------------------------------------------------------------------------------------
# claim + complete


def _ours_worker(conn: psycopg.Connection[Any], size: int, deadline: float, name: str) -> int:
    done = 0
    queues = [QUEUE]
    while time.perf_counter() < deadline:
        rows = conn.execute(OURS_CLAIM, (name, queues, size)).fetchall()
        if not rows:
            break
        if size == 1:
            conn.execute(OURS_COMPLETE, (rows[0][0], rows[0][3])).fetchall()
        else:
            conn.execute(OURS_COMPLETE_MANY, ([r[0] for r in rows], [r[3] for r in rows])).fetchall()
        done += len(rows)
    return done


def _bare_worker(conn: psycopg.Connection[Any], size: int, deadline: float, name: str) -> int:
    done = 0
    while time.perf_counter() < deadline:
        rows = conn.execute(BARE_CLAIM, (QUEUE, size)).fetchall()
        if not rows:
            break
        conn.execute(BARE_COMPLETE, ([r[0] for r in rows],))
        done += len(rows)
    return done


def _drain(
    conns: list[psycopg.Connection[Any]], worker: Callable[..., int], size: int, seconds: float
) -> tuple[float, int]:
    """Runs ``worker`` on every connection in its own thread until ``seconds`` pass or the queue is
    empty; returns jobs/s and jobs done."""
    counts = [0] * len(conns)
    start = threading.Barrier(len(conns) + 1)
    holder: dict[str, float] = {}

    def body(i: int) -> None:
        start.wait()
        counts[i] = worker(conns[i], size, holder["deadline"], f"bench-{i}")

    threads = [threading.Thread(target=body, args=(i,)) for i in range(len(conns))]
    for t in threads:
        t.start()
    holder["deadline"] = time.perf_counter() + seconds
    t0 = time.perf_counter()
    start.wait()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    return sum(counts) / elapsed, sum(counts)


def _prefill_for(size: int, nconn: int, seconds: float) -> int:
    """Enough jobs that a run ends by the clock, not by an empty queue (generous upper rates)."""
    rate = {1: 4_000, 10: 25_000}.get(size, 90_000)
    return int(rate * seconds * 1.3) + 1_000


def _claim_pair(
    dsn: str, admin: psycopg.Connection[Any], size: int, nconn: int, seconds: float
) -> dict[str, Callable[[], float]]:
    n = _prefill_for(size, nconn, seconds)

    def ours() -> float:
        _fill(admin, n, "ours")
        conns = [connect(dsn) for _ in range(nconn)]
        try:
            return _drain(conns, _ours_worker, size, seconds)[0]
        finally:
            for c in conns:
                c.close()

    def bare() -> float:
        _fill(admin, n, "bare")
        conns = [connect(dsn) for _ in range(nconn)]
        try:
            return _drain(conns, _bare_worker, size, seconds)[0]
        finally:
            for c in conns:
                c.close()

    return {"ours": ours, "bare": bare}


# --------------------------------------------------------------------------------------------------------
# claim latency vs depth


def _claim_latency(
    small: psycopg.Connection[Any], large: psycopg.Connection[Any], claims: int
) -> dict[str, list[float]]:
    """Seconds per ``claim`` of one job, on two queues of different depth (two databases), taking turns
    claim by claim so both see the same load. Each claimed job is completed right away (outside the
    timing) so each queue keeps its depth and shape."""

    samples: dict[str, list[float]] = {"small": [], "large": []}
    clock = time.perf_counter
    for i in range(claims + 20):
        for name in ("small", "large") if i % 2 == 0 else ("large", "small"):
            conn = small if name == "small" else large
            t0 = clock()
            rows = conn.execute(OURS_CLAIM, ("bench-latency", [QUEUE], 1)).fetchall()
            dt = clock() - t0
            conn.execute(OURS_COMPLETE, (rows[0][0], rows[0][3])).fetchall()
            if i >= 20:  # the first calls prepare statements and warm caches
                samples[name].append(dt)
    return samples


_SERVER_LOOP = """
DO $$
DECLARE
    t0 timestamptz;
    c  record;
BEGIN
    FOR i IN 1..{n} LOOP
        t0 := clock_timestamp();
        SELECT * INTO c FROM pgjobs.claim(worker => 'bench-latency', queues => '{{{queue}}}');
        INSERT INTO bench_latency VALUES (extract(epoch FROM clock_timestamp() - t0) * 1000);
        PERFORM pgjobs.complete(c.id, c.lease_token);
        COMMIT;
    END LOOP;
END
$$"""


def _claim_server_ms(small: psycopg.Connection[Any], large: psycopg.Connection[Any], claims: int) -> dict[str, float]:
    """Server-side time of one claim (median, ms) on each depth, timed with clock_timestamp() in DO
    blocks that commit after each claim + complete (free of the client round trip and of the commit's
    flush), the two depths taking turns in blocks of 25 claims."""
    for conn in (small, large):
        _exec(conn, "CREATE TEMP TABLE IF NOT EXISTS bench_latency (ms float8)")
        _exec(conn, _SERVER_LOOP.format(n=20, queue=QUEUE))  # warm up
        _exec(conn, "TRUNCATE bench_latency")
    rounds = max(1, claims // 25)
    for r in range(rounds):
        for conn in (small, large) if r % 2 == 0 else (large, small):
            _exec(conn, _SERVER_LOOP.format(n=25, queue=QUEUE))
    out = {}
    for name, conn in (("small", small), ("large", large)):
        row = conn.execute(
            "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY ms) FROM bench_latency", prepare=False
        ).fetchone()
        out[name] = float(row[0]) if row and row[0] is not None else float("nan")
    return out


# --------------------------------------------------------------------------------------------------------


def run(dsn: str, quick: bool = False) -> dict[str, Any]:
    plan = QUICK if quick else FULL
    figures: list[Figure] = []
    notes: list[str] = []
    raw: dict[str, Any] = {}
    admin = connect(dsn)
    _exec(admin, BARE_DDL)
    try:
        # -- enqueue one per commit ------------------------------------------------------------------------
        _reset(admin)
        conn = connect(dsn)
        ours_one = _call(conn, OURS_ENQUEUE, (KIND, PAYLOAD, QUEUE))
        bare_one = _call(conn, BARE_INSERT, (QUEUE, KIND, PAYLOAD))
        for _ in range(20):  # prepare and warm both statements
            ours_one()
            bare_one()
        s = interleaved({"ours": ours_one, "bare": bare_one}, plan.single_calls, plan.single_chunk)
        raw["enqueue_single"] = s
        figures.append(
            figure(
                "enqueue, one per commit",
                median(s["ours"]),
                "jobs/s",
                baseline=median(s["bare"]),
                baseline_name="bare INSERT, one row per commit",
                bar=0.8,
            )
        )

        # -- enqueue_many, batches of 1,000 -----------------------------------------------------------------
        doc = _bulk_doc()
        _reset(admin)
        ours_many = _call(conn, OURS_ENQUEUE_MANY, (doc,))
        bare_many = _call(conn, BARE_INSERT_MANY_IDS, (doc,))
        bare_many_blind = _call(conn, BARE_INSERT_MANY, (doc,), fetch=False)
        for _ in range(2):
            ours_many()
            bare_many()
            bare_many_blind()
        s = interleaved(
            {"ours": ours_many, "bare": bare_many, "bare_blind": bare_many_blind}, plan.bulk_batches, plan.bulk_chunk
        )
        s = {k: [v * 1000 for v in vs] for k, vs in s.items()}
        raw["enqueue_many"] = s
        figures.append(
            figure(
                "enqueue_many, batches of 1,000",
                median(s["ours"]),
                "jobs/s",
                baseline=median(s["bare"]),
                baseline_name="bare 1,000-row INSERT ... SELECT from the same JSON, RETURNING id",
                bar=0.5,
            )
        )
        figures.append(
            figure(
                "enqueue_many, batches of 1,000, vs INSERT without RETURNING",
                median(s["ours"]),
                "jobs/s",
                baseline=median(s["bare_blind"]),
                baseline_name="the same bare INSERT returning nothing (no ids back)",
            )
        )

        # -- the same through the client: AsyncClient / Client one per commit, enqueue_many / enqueue_copy --
        fs, r = core_enqueue.run(
            dsn, plan.single_calls, plan.single_chunk, plan.bulk_batches, plan.bulk_chunk, lambda: _reset(admin)
        )
        figures.extend(fs)
        raw.update(r)

        # -- status events on vs off, enqueue ---------------------------------------------------------------
        # Two queues, one with events off, taking turns call by call.
        _reset(admin)
        _exec(admin, "SELECT pgjobs.configure_queue(queue => %s, status_events => 'none')", (QUEUE + "-quiet",))
        quiet_one = _call(conn, OURS_ENQUEUE, (KIND, PAYLOAD, QUEUE + "-quiet"))
        for _ in range(20):
            quiet_one()
        s = interleaved({"on": ours_one, "off": quiet_one}, plan.single_calls, plan.single_chunk)
        raw["enqueue_single_events"] = s
        figures.append(
            figure(
                "enqueue, one per commit, status events off",
                median(s["off"]),
                "jobs/s",
                baseline=median(s["on"]),
                baseline_name="the same with status events on",
                note="ratio > 1: what status events cost",
            )
        )
        conn.close()

        def events(setting: str) -> Callable[[], None]:
            sql = "SELECT pgjobs.configure_queue(queue => %s, status_events => %s)"
            return lambda: _exec(admin, sql, (QUEUE, setting))

        # -- claim + complete --------------------------------------------------------------------------------
        for size in plan.claim_sizes:
            for nconn in plan.claim_conns:
                rounds = plan.claim_rounds_bar if size == 100 else plan.claim_rounds
                s = alternate(_claim_pair(dsn, admin, size, nconn, plan.claim_seconds), rounds)
                raw[f"claim_complete_{nconn}x{size}"] = s
                how = "complete" if size == 1 else "complete_many"
                figures.append(
                    figure(
                        f"claim {size} + {how}, {nconn} conn",
                        median(s["ours"]),
                        "jobs/s",
                        baseline=median(s["bare"]),
                        baseline_name="bare SKIP LOCKED claim + one UPDATE",
                        # The bar is quoted for one and four connections; sixteen on two cores is shown.
                        bar=0.5 if size == 100 and nconn <= 4 else None,
                    )
                )

        # -- status events on vs off, claim + complete_many ----------------------------------------------------
        for nconn in plan.events_conns:
            pair = _claim_pair(dsn, admin, 100, nconn, plan.claim_seconds)
            ours = pair["ours"]

            def with_events(setting: str, ours: Callable[[], float] = ours) -> Callable[[], float]:
                def go() -> float:
                    rate = 0.0
                    events(setting)()
                    try:
                        rate = ours()
                    finally:
                        events("all")()
                    return rate

                return go

            s = alternate({"off": with_events("none"), "on": with_events("all")}, plan.claim_rounds)
            raw[f"claim_complete_events_{nconn}x100"] = s
            figures.append(
                figure(
                    f"claim 100 + complete_many, {nconn} conn, status events off",
                    median(s["off"]),
                    "jobs/s",
                    baseline=median(s["on"]),
                    baseline_name="the same with status events on",
                    note="ratio > 1: what status events cost",
                )
            )

        # -- claim latency: 10k vs 1M pending, side by side -----------------------------------------------
        # The deep queue lives in a second database of its own, so the two depths can take turns.
        _fill(admin, plan.latency_small, "ours")
        with fresh_database(dsn, "core_deep") as deep_dsn:
            deep_admin = connect(deep_dsn)
            _exec(deep_admin, BARE_DDL)
            _fill(deep_admin, plan.latency_large, "ours")
            small_conn, large_conn = connect(dsn), connect(deep_dsn)
            try:
                client = _claim_latency(small_conn, large_conn, plan.latency_claims)
                server = _claim_server_ms(small_conn, large_conn, plan.latency_claims)
            finally:
                small_conn.close()
                large_conn.close()
                deep_admin.close()
        lat: dict[str, Any] = {}
        for name, depth in (("small", plan.latency_small), ("large", plan.latency_large)):
            lat[str(depth)] = {
                "client_median_ms": median(client[name]) * 1000,
                "client_p95_ms": percentile(client[name], 95) * 1000,
                "server_median_ms": server[name],
            }
        raw["claim_latency"] = lat
        small, large = lat[str(plan.latency_small)], lat[str(plan.latency_large)]
        figures.append(
            figure(
                f"claim latency, {plan.latency_large:,} pending (server)",
                large["server_median_ms"],
                "ms",
                baseline=small["server_median_ms"],
                baseline_name=f"the same with {plan.latency_small:,} pending",
                bar=1.25,
                bar_kind="max",
                note="flat: the larger queue may cost at most 25% more per claim",
            )
        )
        figures.append(
            figure(
                f"claim latency, {plan.latency_large:,} pending (client round trip)",
                large["client_median_ms"],
                "ms",
                baseline=small["client_median_ms"],
                baseline_name=f"the same with {plan.latency_small:,} pending",
                note=f"p95 {large['client_p95_ms']:.2f} ms vs {small['client_p95_ms']:.2f} ms; includes the commit",
            )
        )
    finally:
        _exec(admin, "DROP SCHEMA IF EXISTS bench_bare CASCADE")
        admin.close()

    notes.append(
        "ours and bare alternate A/B/A/B in the same run; figures are medians of the rounds. "
        "claim size 1 completes with pgjobs.complete, sizes 10 and 100 with pgjobs.complete_many."
    )
    return {"suite": "core", "figures": figures, "notes": notes, "raw": raw, "plan": plan.__dict__}

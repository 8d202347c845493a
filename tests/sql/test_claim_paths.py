"""The two copies of the plain claim kept in step: the one-statement path inside ``pgjobs.claim()`` (plain
queues, any kind, or kind limits that bind no cap: a worker's call) and ``_claim_plain`` (which ``claim()`` takes
with a binding kind limit, or beside controlled queues).

A session turns the first off with ``SET pgjobs.claim_fast_path = off``. The same seeded workload runs on two
sets of queues, one claimed with the switch on and one with it off: priorities, jobs scheduled and falling
due, expired leases (reclaimed, or settled on their last attempt), batches starting, a queue whose status
events are filtered, claims over one and two queues of every size, with and without kind limits. After every
step both sides must have picked the same jobs in the same order, left the same rows and sent the same status
events.
"""

from __future__ import annotations

import random
from typing import Any

import psycopg
import pytest
from conftest import ConnectFactory
from psycopg.rows import dict_row

from tests.helpers.foundation import call, claim

Conn = psycopg.Connection[Any]
SIDES = ("f", "g")  # f: claim()'s own statement; g: _claim_plain (the switch off)
FIXED_PAST = "2001-02-03T04:05:06Z"


def _jobs(conn: Conn, side: str) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            "SELECT id, queue, kind, state::text AS state, attempt, max_attempts, priority, payload, meta, group_key,"
            " leased_by, last_error, errors, batch_id, lease_token IS NOT NULL AS leased,"
            " lease_expires_at IS NOT NULL AS has_lease, first_started_at IS NOT NULL AS started,"
            " completed_at IS NOT NULL AS completed"
            " FROM pgjobs.jobs WHERE queue LIKE %s ORDER BY id",
            [f"{side}%"],
        ).fetchall()


class Side:
    """One side's ids and batch ids by position, to compare the sides in a common vocabulary."""

    def __init__(self, name: str, conn: Conn) -> None:
        self.name = name
        self.conn = conn
        self.ids: list[int] = []
        self.batches: list[int] = []
        self.held: list[dict[str, Any]] = []

    def pos(self, job_id: int) -> int:
        return self.ids.index(job_id)

    def batch(self, batch_id: int | None) -> int | None:
        return None if batch_id is None else self.batches.index(batch_id)

    def queue(self, q: str) -> str:
        assert q.startswith(self.name), q
        return q[len(self.name) :]

    def row(self, r: dict[str, Any]) -> dict[str, Any]:
        """A claimed row or a jobs row in the common vocabulary (tokens and timestamps as whether set)."""
        out = {k: v for k, v in r.items() if k not in ("lease_token", "lease_expires_at", "first_started_at")}
        out["id"] = self.pos(r["id"])
        out["queue"] = self.queue(r["queue"])
        out["batch_id"] = self.batch(r["batch_id"])
        if "errors" in out:
            out["errors"] = [{k: v for k, v in e.items() if k != "at"} for e in out["errors"]]
        for key in ("lease_token", "lease_expires_at", "first_started_at"):
            if key in r:
                out[key] = r[key] is not None
        return out

    def event(self, e: dict[str, Any]) -> tuple[Any, ...]:
        return (
            self.pos(e["id"]),
            e["state"],
            self.queue(e["queue"]),
            e["kind"],
            e["attempt"],
            self.batch(e["batch_id"]),
        )


def _load(conn: Conn, sides: dict[str, Side], rnd: random.Random) -> None:
    """The same jobs on both sides, in the same order: plain specs and batches, two queues per side."""
    chunks: list[tuple[bool, list[dict[str, Any]]]] = []
    n = 0
    for _ in range(8):
        as_batch = rnd.random() < 0.3
        specs = []
        for _ in range(rnd.choice([3, 10, 25])):
            spec: dict[str, Any] = {
                "kind": rnd.choice(["a", "b"]),
                "queue": rnd.choice(["1", "1", "2"]),
                "priority": rnd.choice([-1, 0, 0, 0, 1]),
                "max_attempts": rnd.choice([1, 2, 3]),
                "payload": {"n": n},
            }
            r = rnd.random()
            if r < 0.15:
                spec["run_at"] = "2099-01-01T00:00:00Z"  # scheduled; made due later
            elif r < 0.25:
                spec["run_at"] = FIXED_PAST
            if rnd.random() < 0.2:
                spec["meta"] = {"m": n}
            if rnd.random() < 0.2:
                spec["group_key"] = f"g{n % 3}"
            specs.append(spec)
            n += 1
        chunks.append((as_batch, specs))
    for side in sides.values():
        for as_batch, specs in chunks:
            rows = call(
                conn,
                "enqueue_many",
                jobs=[{**s, "queue": side.name + s["queue"]} for s in specs],
                as_batch=as_batch,
            )
            side.ids += [r["id"] for r in rows]
            if as_batch:
                side.batches.append(rows[0]["batch_id"])


def _limits(rnd: random.Random, size: int) -> dict[str, float] | None:
    """Kind limits for a claim of ``size``: none; none that binds (a worker's call: every kind at its free
    capacity or more, one kind alone, a kind at 0); or one that binds (the per-kind path)."""
    return rnd.choice(
        [
            None,
            None,
            {"a": size, "b": size},
            {"a": 1e9, "b": size + 3},
            {"b": size},
            {"a": 0, "b": size},
            {"a": 1, "b": size},
            {},
        ]
    )


def _logged(conn: psycopg.Connection[Any], after: int) -> tuple[int, list[dict[str, Any]]]:
    """The status events logged after ``after``, and the new cursor."""
    rows = call(conn, "read_events", after_id=after, max_rows=1_000_000)
    for r in rows:
        r["state"] = str(r["state"])
    return (rows[-1]["event_id"] if rows else after), rows


@pytest.mark.parametrize("seed", range(8))
def test_claims_fast_path_and_claim_plain_stay_in_step(connect: ConnectFactory, seed: int) -> None:
    rnd = random.Random(seed)
    admin, listener = connect(), connect()
    sides = {"f": Side("f", connect()), "g": Side("g", connect())}
    sides["g"].conn.execute("SET pgjobs.claim_fast_path = off")
    quiet = rnd.choice([None, "terminal", "none"])
    for s in SIDES:
        if quiet:
            call(admin, "configure_queue", queue=f"{s}2", status_events=quiet)
    _load(admin, sides, rnd)
    cursor = _logged(listener, 0)[0]  # status events are read from the durable log (read_events)

    seen: set[str] = set()  # states met along the way, to show the run covered what it compares
    reclaimed = False
    for step in range(50):
        size = rnd.choice([1, 2, 5, 10, 30])
        order = rnd.choice([["1"], ["2"], ["1", "2"], ["2", "1"]])
        limits = _limits(rnd, size)
        got = {}
        for s, side in sides.items():
            rows = claim(side.conn, "w", queues=[s + q for q in order], max_jobs=size, lease=30, kind_limits=limits)
            side.held += rows
            got[s] = [side.row(r) for r in rows]
        assert got["f"] == got["g"], (seed, step, size, order, limits)
        events: dict[str, list[tuple[Any, ...]]] = {s: [] for s in SIDES}
        cursor, logged = _logged(listener, cursor)
        for e in logged:
            side = sides[e["queue"][0]]
            events[side.name].append(side.event(e))
        assert sorted(events["f"]) == sorted(events["g"]), (seed, step)

        # The same moves on both sides, chosen by position: complete some held jobs, let some leases
        # lapse (the next claims reclaim them, or settle them on their last attempt), make some
        # scheduled jobs due.
        held = [sides["f"].pos(r["id"]) for r in sides["f"].held]
        done = {p for p in held if rnd.random() < 0.5}
        lapse = {p for p in held if p not in done and rnd.random() < 0.3}
        due = {p for p in range(len(sides["f"].ids)) if rnd.random() < 0.05}
        for side in sides.values():
            finish = [r for r in side.held if side.pos(r["id"]) in done]
            if finish:
                call(
                    side.conn,
                    "complete_many",
                    ids=[r["id"] for r in finish],
                    lease_tokens=[r["lease_token"] for r in finish],
                )
            side.held = [r for r in side.held if side.pos(r["id"]) not in done | lapse]
            admin.execute(
                "UPDATE pgjobs.jobs SET lease_expires_at = now() - interval '1 second' WHERE id = ANY (%s)",
                [[side.ids[p] for p in lapse]],
            )
            admin.execute(
                "UPDATE pgjobs.jobs SET run_at = %s WHERE id = ANY (%s) AND state = 'scheduled'",
                [FIXED_PAST, [side.ids[p] for p in due]],
            )
        cursor = _logged(listener, cursor)[0]  # the moves' own events are not compared
        table = {s: [side.row(r) for r in _jobs(admin, s)] for s, side in sides.items()}
        assert table["f"] == table["g"], (seed, step)
        seen |= {r["state"] for r in table["f"]}
        reclaimed = reclaimed or any(r["errors"] and r["state"] == "active" for r in table["f"])

    started = {
        s: admin.execute(
            "SELECT array_agg(started_at IS NOT NULL ORDER BY id) FROM pgjobs.batches WHERE id = ANY (%s)",
            [side.batches],
        ).fetchone()
        for s, side in sides.items()
    }
    assert started["f"] == started["g"]
    assert {"pending", "scheduled", "active", "succeeded", "failed"} <= seen, seen
    assert reclaimed


def _tracked(connect: ConnectFactory) -> Conn:
    """A connection (not autocommit) whose transactions count their PL/pgSQL calls."""
    conn = connect(autocommit=False)
    try:
        conn.execute("SET track_functions = 'pl'")
    except psycopg.Error:
        pytest.skip("track_functions needs a superuser")
    conn.commit()
    return conn


def _claim_plain_calls(conn: Conn) -> int:
    row = conn.execute(
        "SELECT coalesce(sum(calls), 0) FROM pg_stat_xact_user_functions WHERE funcname = '_claim_plain'"
    ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("limits", [None, {"k": 2, "other": 5}, {"k": 1e9}])
def test_the_switch_sends_claim_to_claim_plain(connect: ConnectFactory, limits: dict[str, float] | None) -> None:
    """What the comparison above rests on: with the switch off, claim() leases through _claim_plain; with
    it on (the default), _claim_plain is not called, for a worker's call with kind limits that bind no cap too."""
    conn = _tracked(connect)
    call(conn, "enqueue_many", jobs=[{"kind": "k"} for _ in range(4)])
    conn.commit()
    calls = []
    for setting in ("on", "off"):
        conn.execute("SELECT set_config('pgjobs.claim_fast_path', %s, false)", [setting])
        assert len(claim(conn, "w", max_jobs=2, kind_limits=limits)) == 2
        calls.append(_claim_plain_calls(conn))
        conn.rollback()
    assert calls == [0, 1]


def test_a_binding_kind_limit_takes_claim_plain(connect: ConnectFactory) -> None:
    """A kind capped below the claim's size needs the per-kind scans: claim() hands it to _claim_plain."""
    conn = _tracked(connect)
    call(conn, "enqueue_many", jobs=[{"kind": k} for k in "xxxyyy"])
    conn.commit()
    got = claim(conn, "w", max_jobs=4, kind_limits={"x": 1, "y": 4})
    assert sorted(r["kind"] for r in got) == ["x", "y", "y", "y"]
    assert _claim_plain_calls(conn) == 1
    conn.rollback()

"""A stateful model of the job lifecycle, checked after every step.

Hypothesis drives random programs of enqueue (unique keys, single-flight keys, dependencies on existing jobs
and on specs of the same call, batches), claim, complete (with continuations), complete_many, fail, dead_letter,
release, cancel, ack_cancel, retry, delete, cancel_batch, add_to_batch and purge against one database, and
after every step checks:

* the invariants of tests/helpers/invariants.py (an active job holds exactly one lease token, batch counters
  equal a recount, remaining_deps equals the unsettled edges, nothing runs with an unsatisfied edge, ...);
* a terminal job changes only through retry, delete or purge (its state, attempt, result, completed_at);
* the token a claim handed out is the job's token for as long as the job is active (nobody else claims);
* a claimed job's every edge is satisfied;
* a call that raises raises a PJ error and changes no row.

Bounded for CI (``PGJOBS_MODEL_STEPS``, default 4,000 steps at most); ``PGJOBS_MODEL_STEPS=100000`` is the
long run of the issue's bar. Runs are derandomized (the same programs every time) unless
``PGJOBS_FUZZ_RANDOM`` is set; ``PGJOBS_MODEL_SHRINK=1`` shrinks a failure (slow).
"""

from __future__ import annotations

import os
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from psycopg.types.json import Jsonb

from tests.helpers.foundation import module_conn
from tests.helpers.invariants import digest, violations

__all__ = ["module_conn"]  # the fixture, imported for pytest

STEPS = int(os.environ.get("PGJOBS_MODEL_STEPS", "4000"))
STEPS_PER_RUN = 40
Conn = psycopg.Connection[Any]
TERMINAL = ("succeeded", "failed", "cancelled")
TABLES = "pgjobs.jobs, pgjobs.edges, pgjobs.batches, pgjobs.continuation_holds, pgjobs.queues"

keys = st.one_of(st.none(), st.sampled_from(["u1", "u2", "u3"]))
triggers = st.sampled_from(["success", "failure", "complete"])
past = st.sampled_from([None, None, "2020-01-01T00:00:00Z"])


class Lifecycle(RuleBasedStateMachine):
    conn: Conn

    def __init__(self) -> None:
        super().__init__()
        self.ids: list[int] = []
        self.batches: list[int] = []
        self.held: dict[int, str] = {}  # id -> the token our claim got
        self.terminal: dict[int, tuple[Any, ...]] = {}

    @initialize()
    def fresh(self) -> None:
        self.conn.execute(f"TRUNCATE {TABLES} RESTART IDENTITY CASCADE")

    # ---------------------------------------------------------------------------------------- helpers
    def sql(self, query: str, params: Any = None, *, allowed_codes: tuple[str, ...] = ()) -> list[tuple[Any, ...]]:
        """Runs a call; an error must be PJ (and leave every row as it was). Returns [] on error."""
        before = digest(self.conn)
        try:
            with self.conn.transaction():
                return [tuple(r) for r in self.conn.execute(query, params).fetchall()]
        except psycopg.Error as exc:
            assert (exc.sqlstate or "").startswith("PJ"), f"{query} {params}: {exc.sqlstate} {exc}"
            assert not allowed_codes or exc.sqlstate in allowed_codes, f"{query} {params}: {exc}"
            assert digest(self.conn) == before, f"{query} raised {exc.sqlstate} and changed rows"
            return []

    def track(self, rows: list[tuple[Any, ...]], pos: int = 0) -> None:
        for r in rows:
            if r[pos] is not None and r[pos] not in self.ids:
                self.ids.append(r[pos])

    def forget_ended(self, jid: int) -> None:
        self.held.pop(jid, None)

    # ------------------------------------------------------------------------------------------ rules
    @rule(kind=st.sampled_from(["a", "b"]), key=keys, live_only=st.booleans(), run_at=past)
    def enqueue(self, kind: str, key: str | None, live_only: bool, run_at: str | None) -> None:
        rows = self.sql(
            "SELECT id FROM pgjobs.enqueue(kind => %s, unique_key => %s, unique_live_only => %s, run_at => %s)",
            (kind, key, live_only, run_at),
        )
        self.track(rows)

    @rule(
        data=st.data(),
        n=st.integers(1, 3),
        as_batch=st.booleans(),
    )
    def enqueue_many(self, data: st.DataObject, n: int, as_batch: bool) -> None:
        specs: list[dict[str, Any]] = []
        for i in range(n):
            spec: dict[str, Any] = {"kind": data.draw(st.sampled_from(["a", "b"])), "ref": f"r{i}"}
            key = data.draw(keys)
            if key is not None:
                spec["unique_key"] = key
            deps = []
            if self.ids and data.draw(st.booleans()):
                deps.append({"job": data.draw(st.sampled_from(self.ids)), "on": data.draw(triggers)})
            if i > 0 and data.draw(st.booleans()):
                deps.append({"ref": f"r{data.draw(st.integers(0, i - 1))}", "on": data.draw(triggers)})
            if self.batches and data.draw(st.integers(0, 4)) == 0:
                deps.append({"batch": data.draw(st.sampled_from(self.batches)), "on": data.draw(triggers)})
            if deps:
                spec["depends_on"] = deps
            specs.append(spec)
        rows = self.sql(
            "SELECT id, batch_id FROM pgjobs.enqueue_many(jobs => %s, as_batch => %s)", (Jsonb(specs), as_batch)
        )
        self.track(rows)
        for r in rows:
            if r[1] is not None and r[1] not in self.batches:
                self.batches.append(r[1])

    @rule(max_jobs=st.integers(1, 3))
    def claim(self, max_jobs: int) -> None:
        rows = self.sql(
            "SELECT id, lease_token FROM pgjobs.claim(worker => 'm', queues => '{default}', max_jobs => %s,"
            " lease => '1 hour')",
            (max_jobs,),
        )
        for jid, token in rows:
            assert jid not in self.held, f"job {jid} claimed twice while its lease holds"
            self.held[jid] = token
            unmet = self.conn.execute(
                "SELECT count(*) FROM pgjobs.edges WHERE child_id = %s AND satisfied IS NOT TRUE", (jid,)
            ).fetchone()
            assert unmet == (0,), f"job {jid} was claimed with an unsatisfied edge"

    @precondition(lambda self: self.held)
    @rule(data=st.data(), with_continuation=st.booleans())
    def complete(self, data: st.DataObject, with_continuation: bool) -> None:
        jid = data.draw(st.sampled_from(sorted(self.held)))
        cont = Jsonb([{"kind": "a"}]) if with_continuation else None
        self.sql(
            "SELECT pgjobs.complete(id => %s, lease_token => %s, result => '{\"ok\": 1}', continuations => %s)",
            (jid, self.held[jid], cont),
        )
        self.forget_ended(jid)
        self.track(self.conn.execute("SELECT id FROM pgjobs.jobs WHERE id <> ALL (%s)", (self.ids,)).fetchall())

    @precondition(lambda self: self.held)
    @rule()
    def complete_many(self) -> None:
        ids = sorted(self.held)
        self.sql("SELECT pgjobs.complete_many(ids => %s, lease_tokens => %s)", (ids, [self.held[i] for i in ids]))
        for jid in ids:
            self.forget_ended(jid)

    @precondition(lambda self: self.held)
    @rule(data=st.data(), retry_at=past, final=st.booleans())
    def fail(self, data: st.DataObject, retry_at: str | None, final: bool) -> None:
        jid = data.draw(st.sampled_from(sorted(self.held)))
        if final:
            self.sql("SELECT pgjobs.dead_letter(id => %s, lease_token => %s, error => 'x')", (jid, self.held[jid]))
        else:
            self.sql(
                "SELECT pgjobs.fail(id => %s, lease_token => %s, error => 'x', retry_at => %s)",
                (jid, self.held[jid], retry_at),
            )
        self.forget_ended(jid)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        jid = data.draw(st.sampled_from(sorted(self.held)))
        self.sql("SELECT pgjobs.release(id => %s, lease_token => %s)", (jid, self.held[jid]))
        self.forget_ended(jid)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def ack_cancel(self, data: st.DataObject) -> None:
        jid = data.draw(st.sampled_from(sorted(self.held)))
        requested = self.conn.execute("SELECT cancel_requested FROM pgjobs.jobs WHERE id = %s", (jid,)).fetchone()
        rows = self.sql("SELECT pgjobs.ack_cancel(id => %s, lease_token => %s)", (jid, self.held[jid]))
        assert rows == [(bool(requested and requested[0]),)], "ack_cancel ends a job exactly when cancel was requested"
        if rows == [(True,)]:
            self.forget_ended(jid)

    @precondition(lambda self: self.held)
    @rule(data=st.data(), before=st.booleans())
    def add_to_batch(self, data: st.DataObject, before: bool) -> None:
        jid = data.draw(st.sampled_from(sorted(self.held)))
        rows = self.sql(
            'SELECT pgjobs.add_to_batch(id => %s, lease_token => %s, job => \'{"kind": "a"}\','
            " before_continuations => %s)",
            (jid, self.held[jid], before),
        )
        self.track(rows)

    @precondition(lambda self: self.ids)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        self.sql("SELECT pgjobs.cancel(id => %s)", (data.draw(st.sampled_from(self.ids)),))

    @precondition(lambda self: self.batches)
    @rule(data=st.data())
    def cancel_batch(self, data: st.DataObject) -> None:
        self.sql("SELECT pgjobs.cancel_batch(batch_id => %s)", (data.draw(st.sampled_from(self.batches)),))

    @precondition(lambda self: self.ids)
    @rule(data=st.data())
    def retry(self, data: st.DataObject) -> None:
        jid = data.draw(st.sampled_from(self.ids))
        if self.sql("SELECT pgjobs.retry(id => %s)", (jid,)):
            # the retried job, and the children its failure or cancellation had cancelled (retry reopens
            # them: they wait for it again)
            self.terminal = {k: v for k, v in self.terminal.items() if k != jid and v[1] != "cancelled"}

    @precondition(lambda self: self.ids)
    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        jid = data.draw(st.sampled_from(self.ids))
        if self.sql("SELECT pgjobs.delete(id => %s)", (jid,)):
            self.terminal.pop(jid, None)
            self.ids.remove(jid)

    @rule()
    def purge(self) -> None:
        self.sql("SELECT pgjobs.purge(succeeded_before => '0', failed_before => '0')")
        gone = {
            r[0]
            for r in self.conn.execute(
                "SELECT id FROM unnest(%s::bigint[]) AS t(id) EXCEPT SELECT id FROM pgjobs.jobs", (self.ids,)
            )
        }
        for jid in gone:
            self.terminal.pop(jid, None)
            self.ids.remove(jid)
        self.batches = [
            b for b in self.batches if self.conn.execute("SELECT 1 FROM pgjobs.batches WHERE id = %s", (b,)).fetchone()
        ]

    # ------------------------------------------------------------------------------------- invariants
    @invariant()
    def the_model_holds(self) -> None:
        broken = violations(self.conn)
        assert broken == {}, broken
        rows = self.conn.execute(
            "SELECT id, state::text, attempt, result, completed_at, lease_token FROM pgjobs.jobs"
        ).fetchall()
        now = {r[0]: r for r in rows}
        for jid, was in self.terminal.items():
            assert now.get(jid, was)[:5] == was, f"terminal job {jid} changed: {was} -> {now.get(jid)}"
        for jid, token in list(self.held.items()):
            row = now.get(jid)
            if row is None or row[1] != "active":
                self.held.pop(jid)  # ended by a cancel cascade, a batch cancel, ...
            else:
                assert row[5] == token, f"active job {jid} holds another token than the one claimed"
        for jid, row in now.items():
            if row[1] in TERMINAL:
                self.terminal.setdefault(jid, row[:5])


@pytest.mark.timeout(max(600, STEPS // 15))  # (about 40 steps a second on a loaded machine)
def test_the_lifecycle_model_holds(module_conn: Conn) -> None:
    Lifecycle.conn = module_conn
    runs = max(1, STEPS // STEPS_PER_RUN)
    Lifecycle.TestCase.settings = settings(
        max_examples=runs,
        stateful_step_count=STEPS_PER_RUN,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=os.environ.get("PGJOBS_FUZZ_RANDOM") is None,
        # shrinking a database program takes minutes; PGJOBS_MODEL_SHRINK=1 turns it on when debugging
        phases=list(Phase) if os.environ.get("PGJOBS_MODEL_SHRINK") else [Phase.explicit, Phase.generate],
    )
    Lifecycle.TestCase().runTest()

"""Every PJ error path of the foundation: the SQLSTATE, a message naming the bad value, and nothing changed.

The cases share one database (module scope): each one proves that it changed nothing, so they cannot
disturb each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

from tests.helpers.foundation import Conn, module_conn, raises_pj, snapshot

__all__ = ["module_conn"]  # the fixture, imported for pytest


@dataclass(frozen=True)
class Case:
    id: str
    query: str
    code: str
    fragments: tuple[str, ...]


def c(id: str, query: str, *fragments: str, code: str = "PJ002") -> Any:
    return pytest.param(Case(id, query, code, fragments), id=id)


CASES = [
    # enqueue
    c("enqueue-empty-kind", "SELECT * FROM pgjobs.enqueue(kind => '')", "kind", "''"),
    c("enqueue-null-kind", "SELECT * FROM pgjobs.enqueue(kind => NULL)", "kind", "NULL"),
    c("enqueue-empty-queue", "SELECT * FROM pgjobs.enqueue(kind => 'k', queue => '')", "queue", "''"),
    c("enqueue-null-queue", "SELECT * FROM pgjobs.enqueue(kind => 'k', queue => NULL)", "queue", "NULL"),
    c("enqueue-null-payload", "SELECT * FROM pgjobs.enqueue(kind => 'k', payload => NULL)", "payload", "NULL"),
    c("enqueue-max-attempts-0", "SELECT * FROM pgjobs.enqueue(kind => 'k', max_attempts => 0)", "max_attempts", "0"),
    c(
        "enqueue-max-attempts-neg",
        "SELECT * FROM pgjobs.enqueue(kind => 'k', max_attempts => -3)",
        "max_attempts",
        "-3",
    ),
    c("enqueue-full-queue", "SELECT * FROM pgjobs.enqueue(kind => 'k', queue => 'full')", "full", "1", code="PJ001"),
    # enqueue_many: the message names the spec (index) and the bad value
    c("many-not-array", 'SELECT * FROM pgjobs.enqueue_many(jobs => \'{"kind": "k"}\')', "jobs", "array"),
    c("many-null", "SELECT * FROM pgjobs.enqueue_many(jobs => NULL)", "jobs", "NULL"),
    c("many-spec-not-object", 'SELECT * FROM pgjobs.enqueue_many(jobs => \'[{"kind": "k"}, 42]\')', "jobs[1]", "42"),
    c("many-no-kind", "SELECT * FROM pgjobs.enqueue_many(jobs => '[{\"payload\": {}}]')", "jobs[0]", "kind"),
    c("many-empty-kind", 'SELECT * FROM pgjobs.enqueue_many(jobs => \'[{"kind": ""}]\')', "jobs[0]", "kind", '""'),
    c("many-empty-queue", 'SELECT * FROM pgjobs.enqueue_many(jobs => \'[{"kind": "k", "queue": ""}]\')', "queue", '""'),
    c(
        "many-null-payload",
        'SELECT * FROM pgjobs.enqueue_many(jobs => \'[{"kind": "k", "payload": null}]\')',
        "jobs[0]",
        "payload",
    ),
    c(
        "many-max-attempts-0",
        'SELECT * FROM pgjobs.enqueue_many(jobs => \'[{"kind": "k"}, {"kind": "k", "max_attempts": 0}]\')',
        "jobs[1]",
        "max_attempts",
        "0",
    ),
    c(
        "many-priority-text",
        'SELECT * FROM pgjobs.enqueue_many(jobs => \'[{"kind": "k", "priority": "high"}]\')',
        "priority",
        "high",
    ),
    c(
        "many-priority-fraction",
        'SELECT * FROM pgjobs.enqueue_many(jobs => \'[{"kind": "k", "priority": 1.5}]\')',
        "priority",
        "1.5",
    ),
    c(
        "many-priority-range",
        'SELECT * FROM pgjobs.enqueue_many(jobs => \'[{"kind": "k", "priority": 40000}]\')',
        "priority",
        "40000",
    ),
    c(
        "many-run-at",
        'SELECT * FROM pgjobs.enqueue_many(jobs => \'[{"kind": "k", "run_at": "soonish"}]\')',
        "run_at",
        "soonish",
    ),
    c("many-unknown-key", 'SELECT * FROM pgjobs.enqueue_many(jobs => \'[{"kind": "k", "priorty": 1}]\')', "priorty"),
    c("many-meta", 'SELECT * FROM pgjobs.enqueue_many(jobs => \'[{"kind": "k", "meta": [1]}]\')', "meta", "[1]"),
    c(
        "many-unique-key",
        'SELECT * FROM pgjobs.enqueue_many(jobs => \'[{"kind": "k", "unique_key": 7}]\')',
        "unique_key",
        "7",
    ),
    c(
        "many-live-only",
        'SELECT * FROM pgjobs.enqueue_many(jobs => \'[{"kind": "k", "unique_live_only": "yes"}]\')',
        "unique_live_only",
        "yes",
    ),
    c("many-ref", 'SELECT * FROM pgjobs.enqueue_many(jobs => \'[{"kind": "k", "ref": [1]}]\')', "ref", "[1]"),
    c(
        "many-full-queue",
        'SELECT * FROM pgjobs.enqueue_many(jobs => \'[{"kind": "k", "queue": "full"}]\')',
        "full",
        code="PJ001",
    ),
    # claim
    c("claim-empty-worker", "SELECT * FROM pgjobs.claim(worker => '')", "worker", "''"),
    c("claim-null-worker", "SELECT * FROM pgjobs.claim(worker => NULL)", "worker", "NULL"),
    c("claim-max-jobs-0", "SELECT * FROM pgjobs.claim(worker => 'w', max_jobs => 0)", "max_jobs", "0"),
    c("claim-max-jobs-neg", "SELECT * FROM pgjobs.claim(worker => 'w', max_jobs => -2)", "max_jobs", "-2"),
    c("claim-lease-0", "SELECT * FROM pgjobs.claim(worker => 'w', lease => '0 s')", "lease", "00:00:00"),
    c("claim-lease-neg", "SELECT * FROM pgjobs.claim(worker => 'w', lease => '-5 s')", "lease", "-00:00:05"),
    c("claim-no-queues", "SELECT * FROM pgjobs.claim(worker => 'w', queues => '{}')", "queues", "{}"),
    c("claim-empty-queue-name", "SELECT * FROM pgjobs.claim(worker => 'w', queues => '{a,\"\"}')", "queues"),
    c(
        "claim-kind-limits-array",
        "SELECT * FROM pgjobs.claim(worker => 'w', kind_limits => '[1]')",
        "kind_limits",
        "[1]",
    ),
    c(
        "claim-kind-limits-negative",
        "SELECT * FROM pgjobs.claim(worker => 'w', kind_limits => '{\"a\": -1}')",
        "kind_limits",
        "-1",
    ),
    c(
        "claim-kind-limits-text",
        "SELECT * FROM pgjobs.claim(worker => 'w', kind_limits => '{\"a\": \"two\"}')",
        "kind_limits",
        "two",
    ),
    c(
        "claim-kind-limits-fraction",
        "SELECT * FROM pgjobs.claim(worker => 'w', kind_limits => '{\"a\": 0.5}')",
        "kind_limits",
        "0.5",
    ),
    # lease-token calls: bad arguments are errors even with a good token
    c(
        "renew-lease-0",
        "SELECT pgjobs.renew_lease(id => {id}, lease_token => '{token}', lease => '0 s')",
        "lease",
        "00:00:00",
    ),
    c(
        "renew-lease-neg",
        "SELECT pgjobs.renew_lease(id => {id}, lease_token => '{token}', lease => '-1 min')",
        "lease",
        "-00:01:00",
    ),
    c(
        "complete-many-mismatch",
        "SELECT pgjobs.complete_many(ids => ARRAY[{id}, 1], lease_tokens => ARRAY['{token}']::uuid[])",
        "2",
        "1",
    ),
    c("complete-many-null", "SELECT pgjobs.complete_many(ids => NULL, lease_tokens => NULL)", "ids"),
    # managing work
    c("cancel-unknown", "SELECT pgjobs.cancel(id => 987654)", "987654", code="PJ003"),
    c("retry-unknown", "SELECT pgjobs.retry(id => 987654)", "987654", code="PJ003"),
    c("delete-unknown", "SELECT pgjobs.delete(id => 987654)", "987654", code="PJ003"),
    c("retry-active", "SELECT pgjobs.retry(id => {id})", "{id}", "active", code="PJ004"),
    c("retry-pending", "SELECT pgjobs.retry(id => {pending})", "{pending}", "pending", code="PJ004"),
    c("delete-active", "SELECT pgjobs.delete(id => {id})", "{id}", "active", code="PJ004"),
    c("delete-pending", "SELECT pgjobs.delete(id => {pending})", "{pending}", "pending", code="PJ004"),
    c("purge-negative", "SELECT pgjobs.purge(succeeded_before => '-1 day', failed_before => NULL)", "-1"),
    c("configure-empty-queue", "SELECT pgjobs.configure_queue(queue => '')", "queue", "''"),
    c("configure-max-length", "SELECT pgjobs.configure_queue(queue => 'q', max_length => -1)", "max_length", "-1"),
    c("configure-max-active", "SELECT pgjobs.configure_queue(queue => 'q', max_active => -2)", "max_active", "-2"),
    c(
        "configure-max-per-group",
        "SELECT pgjobs.configure_queue(queue => 'q', max_active_per_group => -3)",
        "max_active_per_group",
        "-3",
    ),
    c(
        "configure-noisy-min-active",
        "SELECT pgjobs.configure_queue(queue => 'q', noisy_min_active => -4)",
        "noisy_min_active",
        "-4",
    ),
    c("configure-noisy-share-0", "SELECT pgjobs.configure_queue(queue => 'q', noisy_share => 0)", "noisy_share", "0"),
    c(
        "configure-noisy-share-big",
        "SELECT pgjobs.configure_queue(queue => 'q', noisy_share => 1.5)",
        "noisy_share",
        "1.5",
    ),
    c(
        "configure-noisy-share-neg",
        "SELECT pgjobs.configure_queue(queue => 'q', noisy_share => -0.5)",
        "noisy_share",
        "-0.5",
    ),
    c(
        "configure-status-events",
        "SELECT pgjobs.configure_queue(queue => 'q', status_events => 'loud')",
        "status_events",
        "loud",
    ),
    # reading and workers
    c("list-jobs-max-rows", "SELECT * FROM pgjobs.list_jobs(max_rows => -1)", "max_rows", "-1"),
    c("list-jobs-skip-rows", "SELECT * FROM pgjobs.list_jobs(skip_rows => -1)", "skip_rows", "-1"),
    c("heartbeat-empty-worker", "SELECT pgjobs.worker_heartbeat(worker => '', meta => '{}')", "worker", "''"),
    c("reap-negative", "SELECT pgjobs.reap_workers(stale_after => '-1 min')", "stale_after", "-00:01:00"),
]


def fill(text: str, seeded: dict[str, Any]) -> str:
    for key, value in seeded.items():
        text = text.replace("{" + key + "}", str(value))
    return text


@pytest.fixture(scope="module")
def seeded(module_conn: Conn) -> dict[str, Any]:
    """A pending job, a running one (with its token), a full queue, a worker."""
    conn = module_conn
    pending = conn.execute("SELECT id FROM pgjobs.enqueue(kind => 'k', queue => 'other')").fetchone()[0]  # type: ignore[index]
    conn.execute("SELECT pgjobs.enqueue(kind => 'k')")
    active = conn.execute("SELECT id, lease_token FROM pgjobs.claim(worker => 'w')").fetchone()
    assert active is not None
    conn.execute("SELECT pgjobs.configure_queue(queue => 'full', max_length => 1)")
    conn.execute("SELECT pgjobs.enqueue(kind => 'k', queue => 'full')")
    conn.execute("SELECT pgjobs.worker_heartbeat(worker => 'w', meta => '{}')")
    return {"id": active[0], "token": str(active[1]), "pending": pending}


@pytest.mark.parametrize("case", CASES)
def test_error_path(module_conn: Conn, seeded: dict[str, Any], case: Case) -> None:
    before = snapshot(module_conn)
    fragments = [fill(f, seeded) for f in case.fragments]
    with raises_pj(case.code, *fragments):
        module_conn.execute(fill(case.query, seeded))
    assert snapshot(module_conn) == before


@pytest.mark.smoke
def test_errors_are_raised_inside_the_callers_transaction_which_then_rolls_back(module_conn: Conn) -> None:
    before = snapshot(module_conn)
    with pytest.raises(psycopg.Error) as info, module_conn.transaction():
        module_conn.execute("SELECT pgjobs.enqueue(kind => 'fine')")
        module_conn.execute("SELECT pgjobs.enqueue(kind => '')")
    assert info.value.sqlstate == "PJ002"
    assert snapshot(module_conn) == before


def test_unknown_dependency_trigger_is_pj002(module_conn: Conn) -> None:
    """DESIGN's validation list names an unknown `on` trigger (the dependency graph itself is the workflow issue)."""
    before = snapshot(module_conn)
    with raises_pj("PJ002", "sometimes"):
        module_conn.execute(
            "SELECT * FROM pgjobs.enqueue_many(jobs => "
            '\'[{"kind": "a", "ref": "a"}, {"kind": "b", "depends_on": [{"ref": "a", "on": "sometimes"}]}]\')'
        )
    assert snapshot(module_conn) == before

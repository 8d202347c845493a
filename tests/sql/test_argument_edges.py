"""Arguments a newcomer tries at the edges of the SQL contract: payloads that are not JSON objects, ages just
under 100 calendar years, a stream cursor at the largest bigint, a priority beyond smallint in a job spec.
Each is refused with PJ002 naming the value (and nothing changes) or answered normally."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.helpers.foundation import call, claim_one, enqueue, raises_pj, snapshot

Conn = psycopg.Connection[Any]
NOT_OBJECTS = [[1, 2], "hi", 3, True]


@pytest.mark.parametrize("payload", NOT_OBJECTS)
def test_enqueue_refuses_a_payload_that_is_not_a_json_object(conn: Conn, payload: Any) -> None:
    before = snapshot(conn)
    with raises_pj("PJ002", "payload must be a JSON object"):
        enqueue(conn, "k", payload=payload)
    assert snapshot(conn) == before


@pytest.mark.parametrize("payload", NOT_OBJECTS)
@pytest.mark.parametrize(
    "extra",
    [{}, {"unique_key": "u"}, {"priority": 1}, {"ref": "r", "depends_on": []}],
    ids=["plain", "keyed", "general", "graph"],
)
def test_enqueue_many_refuses_a_payload_that_is_not_a_json_object_on_every_path(
    conn: Conn, payload: Any, extra: dict[str, Any]
) -> None:
    before = snapshot(conn)
    with raises_pj("PJ002", "jobs[1]", "payload must be a JSON object"):
        call(conn, "enqueue_many", jobs=[{"kind": "k", "payload": {}}, {"kind": "k", "payload": payload, **extra}])
    with raises_pj("PJ002", "payload must be a JSON object"):
        call(conn, "enqueue_many", jobs=[{"kind": "k", "payload": payload, **extra}], as_batch=True)
    assert snapshot(conn) == before


def test_enqueue_arrays_refuses_a_payload_that_is_not_a_json_object(conn: Conn) -> None:
    before = snapshot(conn)
    with raises_pj("PJ002", "jobs[1]: payload must be a JSON object", "[1, 2]"):
        call(conn, "enqueue_arrays", kinds=["k", "k"], payloads=Jsonb([{}, [1, 2]]))
    assert snapshot(conn) == before


def test_continuations_batch_additions_and_schedules_refuse_a_payload_that_is_not_an_object(conn: Conn) -> None:
    batch = call(conn, "enqueue_many", jobs=[{"kind": "member"}], as_batch=True)[0]
    enqueue(conn, "parent")
    jobs = {j["kind"]: j for j in [claim_one(conn), claim_one(conn)]}
    before = snapshot(conn)
    with raises_pj("PJ002", "continuations[0]", "payload must be a JSON object"):
        call(conn, "complete", id=jobs["parent"]["id"], lease_token=jobs["parent"]["lease_token"],
             continuations=[{"kind": "next", "payload": "hi"}])  # fmt: skip
    with raises_pj("PJ002", "payload must be a JSON object"):
        call(conn, "add_to_batch", id=batch["id"], lease_token=jobs["member"]["lease_token"],
             job={"kind": "sibling", "payload": [1]})  # fmt: skip
    with raises_pj("PJ002", "payload must be a JSON object"):
        call(conn, "upsert_schedule", name="s", kind="k", cron="* * * * *", next_run_at="2030-01-01T00:00:00Z",
             payload=[1, 2])  # fmt: skip
    assert snapshot(conn) == before


def test_purge_takes_ages_up_to_100_calendar_years(conn: Conn) -> None:
    """Compared as intervals, '100 years' is 36,000 days (months of 30 days), so 36,500 days was refused as
    "more than 100 years": the bound counts a year as 365.25 days."""
    assert call(conn, "purge", succeeded_before="36500 days") == [{"purge": 0}]
    assert call(conn, "purge", failed_before="36525 days") == [{"purge": 0}]
    assert call(conn, "purge", succeeded_before="100 years") == [{"purge": 0}]
    for age in ("36526 days", "101 years", "100 years 1 day"):
        with raises_pj("PJ002", "at most 100 years"):
            call(conn, "purge", succeeded_before=age)


@pytest.mark.parametrize("after_id", [2**63 - 1, 2**63 - 2, 2**62])
def test_read_events_after_the_largest_bigint_reads_nothing(conn: Conn, after_id: int) -> None:
    enqueue(conn, "k")
    assert call(conn, "read_events", after_id=after_id) == []
    assert call(conn, "read_events", after_id=after_id, job_ids=[1, 2]) == []
    assert call(conn, "read_events", after_id=after_id, batch_id=2**63 - 1) == []
    assert len(call(conn, "read_events", after_id=0)) == 1


def test_a_priority_beyond_smallint_in_a_spec_is_pj002_naming_it(conn: Conn) -> None:
    before = snapshot(conn)
    for spec in ({"kind": "k", "priority": 40000}, {"kind": "k", "priority": -40000, "unique_key": "u"}):
        with raises_pj("PJ002", "priority", str(spec["priority"])):
            call(conn, "enqueue_many", jobs=[spec])
    assert snapshot(conn) == before

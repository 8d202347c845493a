"""What the fair-claim tests (tests/sql/test_fair*.py) share: a claim completed at once, claims in a row, the
index entries one claim was handed (pg_stat_get_xact_tuples_returned: live or dead, no timings)."""

from __future__ import annotations

from typing import Any

import psycopg

from tests.helpers.foundation import call

Conn = psycopg.Connection[Any]


def claim_and_complete(conn: Conn, n: int, worker: str = "w", queue: str = "q") -> list[dict[str, Any]]:
    """One claim of up to n jobs on `queue`, completed at once (complete_many); the claimed rows."""
    rows = call(conn, "claim", worker=worker, queues=[queue], max_jobs=n)
    if rows:
        call(conn, "complete_many", ids=[r["id"] for r in rows], lease_tokens=[r["lease_token"] for r in rows])
    return rows


def work(conn: Conn, claims: int, per_claim: int) -> int:
    """`claims` claims of up to `per_claim` jobs, each completed; the jobs done."""
    return sum(len(claim_and_complete(conn, per_claim)) for _ in range(claims))


def claim_entries(
    conn: Conn, *indexes: str, worker: str = "probe", complete: bool = False
) -> tuple[list[int], list[dict[str, Any]]]:
    """Entries of each pgjobs index that one claim of one job on queue q was handed, and what it claimed
    (completed in the same transaction with `complete`)."""
    counts = "SELECT " + ", ".join(f"pg_stat_get_xact_tuples_returned('pgjobs.{i}'::regclass)" for i in indexes)
    with conn.transaction():
        before = conn.execute(counts).fetchone()
        got = call(conn, "claim", worker=worker, queues=["q"], max_jobs=1)
        after = conn.execute(counts).fetchone()
        if complete and got:
            call(conn, "complete", id=got[0]["id"], lease_token=got[0]["lease_token"])
    assert before is not None and after is not None
    return [int(a - b) for a, b in zip(after, before, strict=True)], got

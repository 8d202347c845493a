"""``pgjobs maintain``: one maintenance pass of the status stream and the job history, and what it did; then a
VACUUM of the hot tables that need one (sql/vacuum.sql; ``--no-vacuum`` skips it).

Workers run these passes by themselves (one at a time, from their heartbeat, at most every few seconds), so
this is for operations: to see what the pass does, or to keep the event log rotated while no worker runs.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import psycopg
from rich.console import Console
from rich.table import Table

from pgjobs.cli.common import connect_kwargs
from pgjobs.client import Client
from pgjobs.client.stream import MaintenanceAction
from pgjobs.client.vacuum import vacuum_due_now, vacuum_tables
from pgjobs.jsonable import to_jsonable


def register(subparsers: Any) -> None:
    """Adds ``maintain`` to the ``pgjobs`` command line."""
    p = subparsers.add_parser(
        "maintain",
        help="one maintenance pass of the status stream (tick, truncate, rotate) and the job history; prints it",
        description="One maintenance pass of the status stream's event log: gives ids to committed events, "
        "TRUNCATEs the inbox partitions already copied to the log, rotates the log past its retention; "
        "makes the job history's partitions ahead and applies the queues' retention (drops whole partitions).",
    )
    p.add_argument("--json", action="store_true", help="print the actions as JSON")
    p.add_argument(
        "--no-vacuum",
        dest="vacuum",
        action="store_false",
        help="skip the VACUUM of hot tables that autovacuum will not do (autovacuum off, or far behind)",
    )
    p.set_defaults(func=cmd_maintain, _needs="schema")


def cmd_maintain(args: argparse.Namespace) -> int:
    with Client(args.dsn, min_size=1, max_size=1) as client:
        actions = client.maintain()
    if args.vacuum:
        actions += _vacuum(args.dsn)
    if args.json:
        print(json.dumps(to_jsonable(actions)))
        return 0
    table = Table("action", "target", "rows", box=None, header_style="bold")
    for a in actions:
        table.add_row(a.action, a.target, "" if a.rows is None else str(a.rows))
    Console().print(table)
    return 0


def _vacuum(dsn: str) -> list[MaintenanceAction]:
    """VACUUM of each table vacuum_due lists (rows: its dead tuples before), on an autocommit connection."""
    with psycopg.connect(dsn, **connect_kwargs(dsn)) as conn:  # (autocommit: VACUUM runs outside a transaction)
        due = vacuum_due_now(conn)
        vacuum_tables(conn, due)
    return [MaintenanceAction("vacuum", d.qualified, d.dead_tuples) for d in due]

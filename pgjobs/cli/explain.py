"""``pgjobs explain ID [--json]``: why a job is not running (``pgjobs.explain``, docs/explain.md).

The text form is one line (``job 42 (send_email, queue mail): queue 'mail' is at its cap: 5 of 5 active``);
``--json`` prints the object the SQL function returns. An unknown id exits 1, as ``pgjobs status`` does.
"""

from __future__ import annotations

import argparse
from typing import Any

from pgjobs.cli.common import EXIT_OK, NEEDS_SCHEMA, CliError, open_client, print_json, stdout


def register(sub: Any) -> None:
    p = sub.add_parser("explain", help="why a job is not running (or that it runs, or how it ended)")
    p.add_argument("id", type=int)
    p.add_argument("--json", action="store_true", help="print the explanation as the JSON object explain() returns")
    p.set_defaults(func=cmd_explain, _needs=NEEDS_SCHEMA)


def cmd_explain(args: argparse.Namespace) -> int:
    with open_client(args.dsn) as client:
        why = client.explain(args.id)
    if why is None:
        raise CliError(f"job {args.id} not found")
    if args.json:
        print_json(why.to_json())
    else:
        stdout().print(f"job {args.id}: {why.describe()}", markup=False)
    return EXIT_OK

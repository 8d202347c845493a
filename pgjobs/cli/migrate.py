"""``pgjobs migrate [--status | --verify | --rollback [--to CHANGE] [--yes]]``."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import psycopg
from rich.table import Table

from pgjobs.cli.common import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_USAGE,
    NEEDS_SERVER,
    CliError,
    functions_state,
    not_migrated,
    stdout,
)
from pgjobs.ops import dsn as dsnmod


def register(sub: Any) -> None:
    p = sub.add_parser("migrate", help="apply the schema and install the SQL functions (idempotent)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--rollback", action="store_true", help="revert deployed changes (deletes their data)")
    mode.add_argument("--verify", action="store_true", help="run the verify script of every deployed change")
    mode.add_argument("--status", action="store_true", help="show which changes are deployed")
    p.add_argument("--to", metavar="CHANGE", help="with --rollback: revert only the changes after CHANGE")
    p.add_argument("--yes", "-y", action="store_true", help="with --rollback: do not ask for confirmation")
    p.set_defaults(func=cmd_migrate, _needs=NEEDS_SERVER)


def cmd_migrate(args: argparse.Namespace) -> int:
    from pgjobs.ops import migrate

    out = stdout()
    if args.status:
        try:
            state = migrate.status(args.dsn)
        except migrate.PreReleaseDatabase as exc:
            raise CliError(str(exc)) from None
        table = Table(title="migrations", title_justify="left")
        table.add_column("change")
        table.add_column("deployed")
        table.add_column("note")
        notes = {c.name: c.note for c in migrate.plan()}
        for name, deployed in state.items():
            table.add_row(name, "yes" if deployed else "[yellow]no[/]", notes.get(name, ""))
        out.print(table)
        out.print(f"functions: {functions_state(args.dsn, migrate.sql_digest())}")
        return EXIT_OK if all(state.values()) else EXIT_ERROR
    if args.verify:
        try:
            checked = migrate.verify(args.dsn)
        except migrate.PreReleaseDatabase as exc:
            raise CliError(str(exc)) from None
        except psycopg.OperationalError:
            raise
        except psycopg.Error as exc:
            raise CliError(f"verification failed: {dsnmod.first_line(str(exc))}") from None
        if not checked:
            raise not_migrated(args.dsn, "nothing is deployed", args.where)
        out.print(f"verified {len(checked)} change(s): {', '.join(checked)}")
        return EXIT_OK
    if args.rollback:
        if sys.stdin.isatty() and not args.yes:
            what = f"the changes after {args.to!r}" if args.to else "every pgjobs change (all jobs are deleted)"
            answer = input(f"Revert {what} in {dsnmod.redact(args.dsn)}? [y/N] ")
            if answer.strip().lower() not in ("y", "yes"):
                print("nothing reverted", file=sys.stderr)
                return EXIT_ERROR
        try:
            reverted = migrate.rollback(args.dsn, to=args.to)
        except migrate.MigrationRefused as exc:  # planted objects: see README "The migrator"
            raise CliError(str(exc)) from None
        except ValueError as exc:
            raise CliError(str(exc), EXIT_USAGE) from None
        out.print(f"reverted: {', '.join(reverted)}" if reverted else "nothing to revert")
        return EXIT_OK
    t0 = time.perf_counter()
    try:
        result = migrate.migrate(args.dsn)
    except migrate.MigrationRefused as exc:  # planted objects: see README "The migrator"
        raise CliError(str(exc)) from None
    elapsed = time.perf_counter() - t0
    applied = f"applied {', '.join(result.applied)}" if result.applied else "schema up to date"
    functions = "functions installed" if result.functions_installed else "functions up to date"
    where = " (embedded server)" if args.uses_embedded else ""
    out.print(f"{applied}; {functions} ({elapsed:.2f} s){where}")
    return EXIT_OK

"""The ``pgjobs`` command line: the parser and the dispatch.

Every command is a function ``(args) -> int`` (the exit code) in the module of its group:
:mod:`~pgjobs.cli.migrate`, :mod:`~pgjobs.cli.worker`, :mod:`~pgjobs.cli.jobs` (enqueue, stats, jobs,
cancel, retry, purge), :mod:`~pgjobs.cli.status`, :mod:`~pgjobs.cli.queue`, :mod:`~pgjobs.cli.schedules`,
:mod:`~pgjobs.cli.demo`; what they share is :mod:`pgjobs.cli.common`. Only this module imports them.
:func:`main` resolves the database once (``--dsn``, ``PGJOBS_DSN``, ``DATABASE_URL``, else the embedded
server; see :mod:`pgjobs.ops.dsn`), puts the DSN in ``args.dsn``, checks that the server answers and (for
commands that need it) that the schema is installed, and turns every expected failure into one line on
stderr and an exit code:

====  =====================================================================
0     done
1     refused by pgjobs (a ``PJxxx`` error: unknown job, wrong state, ...) or a job that ended badly
2     bad arguments, or the database cannot be reached
3     the database has no pgjobs schema (run ``pgjobs migrate``)
4     ``worker --app``: the module or attribute cannot be found
130   interrupted (Ctrl-C); 143 after SIGTERM
====  =====================================================================
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from psycopg_pool import PoolTimeout

from pgjobs import __version__
from pgjobs.cli import jobs as cli_jobs
from pgjobs.cli import migrate as cli_migrate
from pgjobs.cli import status as cli_status
from pgjobs.cli import worker as cli_worker
from pgjobs.cli.common import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    NEEDS_NOTHING,
    NEEDS_SCHEMA,
    CliError,
    check_database,
    functions_state,
    non_negative_float,
    not_migrated,
    one_line,
    parse_duration,
    parse_queues,
    positive_int,
    progress_fraction,
    unreachable,
)
from pgjobs.errors import PgJobsError, SchemaMissing
from pgjobs.ops import dsn as dsnmod

# kept importable from here (older tests and scripts): the parsers and helpers live in pgjobs.cli.common
__all__ = ["CliError", "build_parser", "main", "parse_duration", "parse_queues", "progress_fraction"]


def cmd_demo(args: argparse.Namespace) -> int:
    from pgjobs.cli import demo

    return demo.run(args)


def cmd_bench(args: argparse.Namespace) -> int:
    return _bench(args.bench_args)


def _bench(argv: list[str]) -> int:
    try:
        from bench.__main__ import main as bench_main
    except ImportError as exc:
        raise CliError(f"the benchmarks are not installed ({exc}); run them from a source checkout") from None
    return int(bench_main(argv, prog="pgjobs bench") or 0)


# ---------------------------------------------------------------------------------------------------------
# the parser


def _add_common(parser: argparse.ArgumentParser, default: Any) -> None:
    parser.add_argument(
        "--dsn",
        default=default,
        help="PostgreSQL DSN or URI (default: $PGJOBS_DSN, else $DATABASE_URL, else the embedded server)",
    )
    parser.add_argument(
        "--data-dir",
        default=default,
        help="data directory of the embedded server (default: $PGJOBS_DATA_DIR, else a per-user directory)",
    )


class CommandParser(argparse.ArgumentParser):
    """Every subcommand's parser: ``--dsn`` and ``--data-dir`` are also accepted after the command name.

    ``argparse.SUPPRESS`` as default keeps a subcommand from overwriting the value given before it.
    Subcommands added by other modules (``register(subparsers)``) get the same options for free.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _add_common(self, argparse.SUPPRESS)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pgjobs",
        description="Durable background jobs inside PostgreSQL.",
        epilog="Exit codes: 0 ok, 1 refused/failed, 2 bad arguments or database unreachable, "
        "3 schema not migrated, 4 unknown --app, 130 interrupted.",
    )
    _add_common(parser, None)
    parser.add_argument("--version", action="version", version=f"pgjobs {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=CommandParser)

    cli_migrate.register(sub)
    cli_worker.register(sub)
    cli_jobs.register(sub)
    cli_status.register(sub)

    p = sub.add_parser(
        "demo",
        help="a showcase on the embedded PostgreSQL (or --dsn): jobs, retries, a resumed checkpoint, live progress",
    )
    p.add_argument("--no-worker", action="store_true", help="only enqueue and watch (a separate worker runs the jobs)")
    p.add_argument("--concurrency", type=positive_int, default=20, help="the in-process worker's concurrency (20)")
    p.add_argument("--timeout", type=non_negative_float, default=60.0, metavar="S", help="give up after S seconds (60)")
    p.add_argument("--plain", action="store_true", help="plain log lines instead of the live display")
    p.set_defaults(func=cmd_demo, _needs=NEEDS_NOTHING)

    p = sub.add_parser("bench", help="run the benchmarks (pgjobs bench --help lists their options)", add_help=False)
    p.add_argument("bench_args", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_bench, _needs=NEEDS_NOTHING)

    for register in _plugins():
        register(sub)
    return parser


def _plugins() -> list[Callable[[Any], None]]:
    """``register(subparsers)`` of the command groups that live beside their layer (imported when the parser
    is built: the schedules and web modules pull in the scheduler and the dashboard)."""
    from pgjobs.cli import explain as cli_explain
    from pgjobs.cli import maintain as cli_maintain
    from pgjobs.cli import queue as cli_queue
    from pgjobs.cli import rates as cli_rates
    from pgjobs.cli import schedules as cli_schedules
    from pgjobs.web import server as web

    return [
        cli_queue.register,
        cli_schedules.register,
        web.register,
        cli_maintain.register,
        cli_explain.register,
        cli_rates.register,
    ]


def _global_split(argv: Sequence[str]) -> tuple[list[str], str | None, list[str]]:
    """Splits ``argv`` at the command: (global options, command, the rest)."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("--dsn", "--data-dir"):
            i += 2
            continue
        if arg.startswith(("--dsn=", "--data-dir=")):
            i += 1
            continue
        if arg.startswith("-"):
            return list(argv), None, []
        return list(argv[:i]), arg, list(argv[i + 1 :])
    return list(argv), None, []


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    try:
        return _main(args_list)
    except CliError as exc:
        _error(str(exc))
        return exc.code
    except KeyboardInterrupt:
        _error("interrupted")
        return EXIT_INTERRUPTED
    except SystemExit as exc:  # argparse: --help (0), bad arguments (2); SIGTERM with the embedded server (143)
        return exc.code if isinstance(exc.code, int) else EXIT_OK if exc.code is None else EXIT_ERROR


def _error(message: str) -> None:
    print(f"pgjobs: {one_line(message)}", file=sys.stderr)


def _main(argv: list[str]) -> int:
    before, command, rest = _global_split(argv)
    if command == "bench":
        # everything after `bench` is the benchmark's own, `--help` included
        global_only = argparse.ArgumentParser(prog="pgjobs")
        _add_common(global_only, None)
        parsed = global_only.parse_args(before)
        found = dsnmod.configured(parsed.dsn)
        if found is not None:
            os.environ[dsnmod.ENV_DSN] = found[0]
        return _bench(rest)

    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    if getattr(args, "to", None) and not getattr(args, "rollback", False):
        parser.error("--to needs --rollback")
    if args.command == "purge" and args.succeeded_before is None and args.failed_before is None:
        parser.error("purge needs --succeeded-before and/or --failed-before")
    needs = getattr(args, "_needs", NEEDS_SCHEMA)
    func: Callable[[argparse.Namespace], int] = args.func
    if needs == NEEDS_NOTHING:
        args.target = None
        args.uses_embedded = False
        args.where = None
        return func(args)
    try:
        with dsnmod.resolve(args.dsn, args.data_dir) as target:
            args.target = target
            args.dsn = target.dsn
            args.uses_embedded = target.uses_embedded
            args.where = target.describe() if target.uses_embedded else None
            # a read DSN (status, stats) is all such a command talks to: the primary may be down
            read_dsn = getattr(args, "read_dsn", None)
            check_database(read_dsn or target.dsn, needs == NEEDS_SCHEMA, None if read_dsn else args.where)
            return _run(func, args)
    except dsnmod.DsnError as exc:
        raise CliError(str(exc), EXIT_UNREACHABLE) from None


def _run(func: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    try:
        return func(args)
    except Exception as exc:
        mapped = _expected(_only_leaf(exc), args)
        if mapped is None:
            raise
        raise mapped from None


def _only_leaf(exc: BaseException) -> BaseException:
    """The one exception inside (nested) exception groups, as anyio task groups raise them; else ``exc``."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _lost_server(exc: psycopg.OperationalError) -> bool:
    """No server to talk to: a failure on the client's side (no SQLSTATE), a connection exception (class 08)
    or a server shutting down or starting (57P01-57P03). A lock timeout or a cancelled statement is an
    OperationalError too, but from a server that answered."""
    state = exc.sqlstate
    return state is None or state.startswith("08") or state in ("57P01", "57P02", "57P03")


def _expected(exc: BaseException, args: argparse.Namespace) -> CliError | None:
    """The one-line error for a failure a user can expect, or None for a bug (its traceback is shown)."""
    if isinstance(exc, CliError):
        return exc
    if isinstance(exc, SchemaMissing):
        return not_migrated(args.dsn, dsnmod.first_line(str(exc)), args.where)
    if isinstance(exc, PgJobsError):
        return CliError(str(exc), EXIT_ERROR)
    if isinstance(exc, PoolTimeout) or (isinstance(exc, psycopg.OperationalError) and _lost_server(exc)):
        return unreachable(args.dsn, exc, args.where)
    if isinstance(
        exc, psycopg.errors.UndefinedTable | psycopg.errors.UndefinedFunction | psycopg.errors.UndefinedColumn
    ):
        # an object the installed pgjobs lacks: the schema is older (or newer) than this package's
        with contextlib.suppress(psycopg.Error):
            if functions_state(args.dsn, _sql_digest()) != "up to date":
                return not_migrated(args.dsn, f"it is out of date: {dsnmod.first_line(str(exc))}", args.where)
        return None
    if isinstance(exc, psycopg.Error) and not os.environ.get("PGJOBS_DEBUG"):
        state = f" [{exc.sqlstate}]" if exc.sqlstate else ""
        return CliError(f"database error{state}: {dsnmod.first_line(str(exc))} (PGJOBS_DEBUG=1 shows the traceback)")
    return None


def _sql_digest() -> str:
    from pgjobs.ops.migrate import sql_digest

    return sql_digest()


if __name__ == "__main__":
    sys.exit(main())

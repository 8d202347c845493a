"""What every ``pgjobs`` command shares: exit codes, :class:`CliError`, argument parsers, output helpers,
the database checks and :func:`open_client`, and :func:`load_app` (``--app MODULE:ATTR``).

The command modules (``migrate``, ``worker``, ``jobs``, ``status``, ``schedules``, ``queue``, ``demo``) import
this module and nothing else of ``pgjobs.cli``; :mod:`pgjobs.cli.main` imports them all (no cycles).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import re
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool, PoolTimeout
from rich.console import Console
from rich.text import Text

from pgjobs.client import Client
from pgjobs.jsonable import CLI_DISPLAY_CHARS, cut_text, shown_json, to_jsonable
from pgjobs.ops import dsn as dsnmod
from pgjobs.ops import probe
from pgjobs.records import JobState, UnhandledKind

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 2
EXIT_NOT_MIGRATED = 3
EXIT_UNKNOWN_APP = 4
EXIT_INTERRUPTED = 130

CONNECT_TIMEOUT = 10

# what a command needs before it runs: nothing, a server that answers, or an installed schema
NEEDS_NOTHING = "nothing"
NEEDS_SERVER = "server"
NEEDS_SCHEMA = "schema"

STATES = [s.value for s in JobState]


class CliError(Exception):
    """An expected failure: printed as one line on stderr, exits with ``code``."""

    def __init__(self, message: str, code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.code = code


# ---------------------------------------------------------------------------------------------------------
# small helpers shared by the commands (and pgjobs.cli.demo)


def stdout() -> Console:
    # piped output: wide enough that tables are not cut at 80 columns (COLUMNS still wins)
    wide = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    return Console(highlight=False, soft_wrap=False, width=160 if wide else None)


def one_line(text: str) -> str:
    return " ".join(text.split())


def parse_duration(text: str) -> timedelta:
    """``90s``, ``15m``, ``12h``, ``7d``, ``2w`` and sums like ``1d12h``; a bare number is seconds."""
    value = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", value):
        return timedelta(seconds=float(value))
    units = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([smhdw])", value)
    if not parts or re.sub(r"(\d+(?:\.\d+)?)\s*([smhdw])", "", value).strip():
        raise argparse.ArgumentTypeError(f"invalid duration {text!r} (examples: 30s, 15m, 12h, 7d, 1d12h)")
    total = timedelta()
    for number, unit in parts:
        total += timedelta(**{units[unit]: float(number)})
    return total


def parse_when(text: str) -> datetime:
    """``--run-at``: an ISO 8601 time (no zone: local time), or a delay from now (``30s``, ``+5m``, ``2h``)."""
    value = text.strip()
    with contextlib.suppress(argparse.ArgumentTypeError):
        return datetime.now(UTC) + parse_duration(value.removeprefix("+").removeprefix("in "))
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid time {text!r} (an ISO 8601 time like 2026-12-01T09:30:00+00:00, or a delay like 30s, 5m)"
        ) from None
    return when if when.tzinfo is not None else when.astimezone()


def parse_json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"invalid JSON ({exc.msg} at column {exc.colno}): {text!r}") from None


def parse_queues(text: str) -> dict[str, int | None]:
    """``default=10,emails=5`` (or ``default,emails``: the size comes from ``--concurrency``)."""
    queues: dict[str, int | None] = {}
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        name, sep, size = item.partition("=")
        name = name.strip()
        if not name:
            raise argparse.ArgumentTypeError(f"empty queue name in {text!r}")
        if sep:
            try:
                n = int(size)
            except ValueError:
                n = 0
            if n < 1:
                raise argparse.ArgumentTypeError(
                    f"queue {name!r}: concurrency must be a positive integer, got {size!r}"
                )
            queues[name] = n
        else:
            queues[name] = None
    if not queues:
        raise argparse.ArgumentTypeError(f"no queue in {text!r} (example: default=10,emails=5)")
    return queues


def positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return n


def non_negative_float(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        x = -1.0
    if x < 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got {text!r}")
    return x


def positive_float(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        x = 0.0
    if not x > 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    return x


def progress_fraction(progress: Any) -> float | None:
    """A fraction in [0, 1] from a job's progress, when it has a recognisable shape.

    Recognised: a number in [0, 1]; ``{"done": n, "total": m}`` (also ``current``/``total``);
    ``{"percent": p}``; ``{"fraction": f}``. Anything else is shown as JSON.
    """
    if isinstance(progress, bool):
        return None
    if isinstance(progress, int | float):
        return float(progress) if 0 <= progress <= 1 else None
    if isinstance(progress, dict):
        total = progress.get("total")
        done = progress.get("done", progress.get("current"))
        if isinstance(total, int | float) and isinstance(done, int | float) and total > 0:
            return max(0.0, min(1.0, float(done) / float(total)))
        if isinstance(progress.get("percent"), int | float):
            return max(0.0, min(1.0, float(progress["percent"]) / 100))
        if isinstance(progress.get("fraction"), int | float):
            return max(0.0, min(1.0, float(progress["fraction"])))
    return None


def describe_progress(progress: Any) -> str:
    if progress is None:
        return ""
    fraction = progress_fraction(progress)
    message = progress.get("message") if isinstance(progress, dict) else None
    if fraction is not None:
        text = f"{fraction:.0%}"
        if isinstance(progress, dict) and "done" in progress and "total" in progress:
            text += f" ({progress['done']}/{progress['total']})"
        return f"{text} {cut_text(str(message), CLI_DISPLAY_CHARS)}" if message else text
    return shown_json(progress, CLI_DISPLAY_CHARS)


def job_json(job: Any) -> dict[str, Any]:
    """A job record as JSON output shows it: everything but its lease token, the secret that lets whoever
    holds it complete, fail or release the running attempt."""
    data: dict[str, Any] = to_jsonable(job)
    data.pop("lease_token", None)
    return data


def print_unhandled(out: Console, unhandled: list[UnhandledKind]) -> None:
    """The jobs no live worker will take, one line per queue and kind (nothing when there are none)."""
    for u in unhandled:
        out.print(Text(f"not running: {u.describe()}", style="yellow"))


def print_json(value: Any) -> None:
    print(json.dumps(to_jsonable(value), indent=2, sort_keys=False))


def ago(when: datetime | None, now: datetime | None = None) -> str:
    if when is None:
        return ""
    seconds = ((now or datetime.now(UTC)) - when).total_seconds()
    future = seconds < 0
    seconds = abs(seconds)
    if seconds < 1:
        text = f"{seconds * 1000:.0f} ms"
    elif seconds < 90:
        text = f"{seconds:.0f} s"
    elif seconds < 90 * 60:
        text = f"{seconds / 60:.0f} min"
    elif seconds < 36 * 3600:
        text = f"{seconds / 3600:.1f} h"
    else:
        text = f"{seconds / 86400:.1f} d"
    return f"in {text}" if future else f"{text} ago"


def short(text: str | None, width: int = 60) -> str:
    if not text:
        return ""
    line = one_line(text)
    return line if len(line) <= width else line[: width - 1] + "…"


# ---------------------------------------------------------------------------------------------------------
# the database


def connect_kwargs(dsn: str) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"autocommit": True}
    if "PGCONNECT_TIMEOUT" not in os.environ and not conninfo_to_dict(dsn).get("connect_timeout"):
        kwargs["connect_timeout"] = CONNECT_TIMEOUT
    return kwargs


def unreachable(dsn: str, exc: BaseException, where: str | None = None) -> CliError:
    reason = dsnmod.first_line(str(exc)) or type(exc).__name__
    return CliError(f"cannot connect to {where or 'the database ' + dsnmod.redact(dsn)}: {reason}", EXIT_UNREACHABLE)


def not_migrated(dsn: str, detail: str = "", where: str | None = None) -> CliError:
    suffix = f" ({detail})" if detail else ""
    return CliError(
        f"{where or 'the database ' + dsnmod.redact(dsn)} has no pgjobs schema{suffix}; run `pgjobs migrate` first",
        EXIT_NOT_MIGRATED,
    )


def check_database(dsn: str, need_schema: bool, where: str | None = None) -> None:
    """Raises :class:`CliError` (exit 2) when the server does not answer, (exit 3) when the schema is missing."""
    try:
        if not need_schema:
            psycopg.connect(dsn, **connect_kwargs(dsn)).close()
            return
        has_schema, has_functions = probe.schema_state(dsn, **connect_kwargs(dsn))
    except psycopg.OperationalError as exc:
        raise unreachable(dsn, exc, where) from None
    if not has_schema:
        raise not_migrated(dsn, where=where)
    if not has_functions:
        raise not_migrated(dsn, "its functions are not installed", where)


@contextlib.contextmanager
def open_client(dsn: str, app: Any = None) -> Iterator[Client]:
    """A small :class:`Client` whose pool gives up after the connect timeout instead of 30 s."""
    pool: ConnectionPool[Any] = ConnectionPool(
        dsn, min_size=1, max_size=2, kwargs=connect_kwargs(dsn), timeout=CONNECT_TIMEOUT, open=False, name="pgjobs-cli"
    )
    try:
        pool.open(wait=True, timeout=CONNECT_TIMEOUT)
    except PoolTimeout as exc:
        pool.close()
        raise unreachable(dsn, exc) from None
    try:
        with Client(pool=pool, app=app) as client:
            yield client
    finally:
        pool.close()


def functions_state(dsn: str, digest: str) -> str:
    installed = probe.installed_digest(dsn, **connect_kwargs(dsn))
    if installed is None:
        return "not installed"
    return "up to date" if installed == digest else "outdated (run `pgjobs migrate`)"


# ---------------------------------------------------------------------------------------------------------
# worker


def load_app(spec: str) -> Any:
    """``module:attribute`` (``module`` alone means ``module:app``) -> the :class:`pgjobs.App`."""
    import pgjobs

    module_name, _, attr_path = spec.partition(":")
    module_name = module_name.strip()
    attr_path = attr_path.strip() or "app"
    if not module_name:
        raise CliError(f"--app {spec!r}: expected module:attribute, e.g. myproject.jobs:app", EXIT_UNKNOWN_APP)
    # like `python -m`: the current directory is importable, so `--app tasks:app` finds ./tasks.py
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise CliError(f"--app {spec!r}: no module named {exc.name!r}", EXIT_UNKNOWN_APP) from None
        raise CliError(f"--app {spec!r}: importing {module_name!r} failed: {exc}", EXIT_UNKNOWN_APP) from None
    except ImportError as exc:
        raise CliError(f"--app {spec!r}: importing {module_name!r} failed: {exc}", EXIT_UNKNOWN_APP) from None
    obj: Any = module
    for part in attr_path.split("."):
        if not hasattr(obj, part):
            raise CliError(f"--app {spec!r}: module {module_name!r} has no attribute {attr_path!r}", EXIT_UNKNOWN_APP)
        obj = getattr(obj, part)
    if not isinstance(obj, pgjobs.App):
        raise CliError(f"--app {spec!r}: {attr_path!r} is a {type(obj).__name__}, not a pgjobs.App", EXIT_UNKNOWN_APP)
    return obj


def error_line(text: str | None) -> str:
    """The exception's own line of a Python traceback (``ValueError: boom``); other text as it is.

    The worker stores the whole traceback (``last_error`` and every entry of ``errors``): the lists show
    the line that says what went wrong, ``pgjobs status ID --errors`` the full history.
    """
    if not text:
        return ""
    lines = text.rstrip().splitlines()
    if not any("Traceback (most recent call last):" in line for line in lines):
        return text
    # the last unindented line after the last frame ("  File ...", "    code") begins the exception's text,
    # which may span several lines (a multi-line message, notes)
    last_frame = max((i for i, line in enumerate(lines) if line.startswith("  ")), default=-1)
    tail = [line for line in lines[last_frame + 1 :] if line.strip()]
    if tail:
        return "\n".join(tail)
    # an exception group ends in its members' indented "| Name: message" lines: the first one says enough
    for line in lines:
        found = re.match(r"^[\s|+-]*\|\s((?:\w+\.)*\w+: .*)$", line)
        if found and not found.group(1).startswith(("File ", "Traceback")):
            return found.group(1)
    return lines[-1]

"""``python -m bench`` / ``pgjobs bench``: runs the suites and prints a table of figures vs baselines.

Each suite runs in a fresh database (``CREATE DATABASE bench_<suite>_<random>``, migrated, dropped
afterwards), so user data is never touched. The server comes from ``--dsn``, else ``PGJOBS_DSN``, else
the embedded PostgreSQL (``pgjobs[embedded]``). Results go to ``--json`` (default
``bench/results/<timestamp>.json``).

``python -m bench peers [--n N] [--repeat R]`` runs pgjobs beside its peers instead (:mod:`bench.peers`).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib
import inspect
import json
import math
import os
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from psycopg.conninfo import conninfo_to_dict

from . import EXTRA_SUITES, SUITES
from .common import Figure, fresh_database, server_settings

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def _parser(prog: str = "python -m bench") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="pgjobs benchmarks: each figure next to its bare-PostgreSQL baseline measured in the same run.",
    )
    p.add_argument("--dsn", help="PostgreSQL server to benchmark on (default: $PGJOBS_DSN, else the embedded server)")
    p.add_argument("--quick", action="store_true", help="small counts: a smoke run of about a minute")
    p.add_argument(
        "--only",
        metavar="SUITES",
        help=f"comma-separated suites to run (default: all of {','.join(SUITES)})",
    )
    p.add_argument(
        "--json", metavar="PATH", help="where to write the results (default: bench/results/<timestamp>.json)"
    )
    p.add_argument("--fail-on-bars", action="store_true", help="exit 1 when a figure misses its bar")
    return p


@contextlib.contextmanager
def _server(dsn: str | None) -> Iterator[tuple[str, str]]:
    """(dsn, where it came from); starts and stops the embedded server when no DSN is given."""
    if dsn:
        yield dsn, "--dsn"
        return
    if env := os.environ.get("PGJOBS_DSN"):
        yield env, "PGJOBS_DSN"
        return
    from pgjobs.ops import embedded

    started = embedded.start()
    try:
        yield started, "embedded"
    finally:
        embedded.stop()


def _run_suite(name: str, server_dsn: str, quick: bool) -> dict[str, Any]:
    try:
        module = importlib.import_module(f"bench.{name}")
    except ModuleNotFoundError as exc:
        if exc.name in (f"bench.{name}", "bench"):
            return {"suite": name, "skipped": f"bench/{name}.py is not there yet", "figures": []}
        raise
    run = getattr(module, "run", None)
    if run is None:
        return {"suite": name, "skipped": f"bench/{name}.py has no run(dsn, ...)", "figures": []}
    kwargs: dict[str, Any] = {}
    if "quick" in inspect.signature(run).parameters:
        kwargs["quick"] = quick
    t0 = time.perf_counter()
    with fresh_database(server_dsn, name) as dsn:
        result = run(dsn, **kwargs)
        database = conninfo_to_dict(dsn).get("dbname")
    if not isinstance(result, dict):
        result = {"value": result}
    result.setdefault("database", database)
    result.setdefault("suite", name)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    result["figures"] = _figures(result)
    return result


def _figures(result: dict[str, Any]) -> list[Figure]:
    """The suite's figures; a suite that returned bare numbers gets one informational row each."""
    figs = result.get("figures")
    if isinstance(figs, list) and all(isinstance(f, dict) and "name" in f for f in figs):
        return figs
    out: list[Figure] = []

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, bool):
            return
        if isinstance(value, int | float):
            out.append({"name": prefix, "value": value, "unit": "", "passed": None})
        elif isinstance(value, dict):
            for k, v in value.items():
                if k not in ("suite", "seconds", "notes", "figures", "raw"):
                    walk(f"{prefix}.{k}" if prefix else str(k), v)

    walk("", result)
    return out


# --------------------------------------------------------------------------------------------------------
# output


def _num(value: Any, unit: str = "") -> str:
    if value is None:
        return ""
    if isinstance(value, float) and math.isnan(value):
        return "n/a"
    if isinstance(value, int | float):
        text = f"{value:,.2f}" if unit == "ms" or abs(value) < 100 else f"{value:,.0f}"
        return f"{text} {unit}".strip()
    return str(value)


def _bar(f: Figure) -> str:
    if f.get("bar") is None:
        return ""
    return ("≥ " if f.get("bar_kind", "min") == "min" else "≤ ") + f"{f['bar']:.2f}"


def _verdict(f: Figure) -> str:
    return {True: "pass", False: "FAIL"}.get(f.get("passed"), "")  # type: ignore[arg-type]


def _rows(results: list[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for r in results:
        for f in r.get("figures", []):
            rows.append(
                [
                    r["suite"],
                    str(f["name"]),
                    _num(f.get("value"), f.get("unit", "")),
                    _num(f.get("baseline"), f.get("unit", "")),
                    "" if f.get("ratio") is None else f"{f['ratio']:.2f}",
                    _bar(f),
                    _verdict(f),
                ]
            )
    return rows


HEADERS = ["suite", "figure", "value", "baseline", "ratio", "bar", "result"]


def _print_table(results: list[dict[str, Any]]) -> None:
    rows = _rows(results)
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(HEADERS)]
        print("  ".join(h.ljust(w) for h, w in zip(HEADERS, widths, strict=True)))
        for r in rows:
            print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
    else:
        table = Table(title="pgjobs benchmarks", show_lines=False)
        for h in HEADERS:
            table.add_column(h, justify="right" if h in ("value", "baseline", "ratio") else "left")
        for r in rows:
            style = {"FAIL": "red", "pass": "green"}.get(r[-1])
            table.add_row(*r, style=style)
        console = Console()
        if not console.is_terminal:
            console = Console(width=160)  # a log or a pipe: no wrapping of the figure names
        console.print(table)
    for res in results:
        if res.get("skipped"):
            print(f"- {res['suite']}: skipped ({res['skipped']})")
        if res.get("error"):
            print(f"- {res['suite']}: ERROR {res['error']}")
        for f in res.get("figures", []):
            if f.get("baseline_name") or f.get("note"):
                extra = "; ".join(
                    x
                    for x in (
                        f"baseline: {f.get('baseline_name')}" if f.get("baseline_name") else "",
                        f.get("note") or "",
                    )
                    if x
                )
                print(f"  {res['suite']} / {f['name']}: {extra}")
        for n in res.get("notes", []) or []:
            print(f"  {res['suite']}: {n}")


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def main(argv: list[str] | None = None, prog: str = "python -m bench") -> int:
    """``prog``: the command name --help and usage errors show (``pgjobs bench`` when run from the CLI)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["peers"]:
        # pgjobs side by side with procrastinate, pgqueuer and awa (bench/peers.py; extra `bench-peers`)
        from . import peers

        return peers.main(argv[1:])
    if argv[:1] == ["soak"]:  # its own options: python -m bench soak --help
        from .soak import main as soak_main

        return soak_main(argv[1:])
    args = _parser(prog).parse_args(argv)
    names = [s.strip() for s in args.only.split(",")] if args.only else list(SUITES)
    unknown = [n for n in names if n not in SUITES + EXTRA_SUITES]
    if unknown:
        print(f"unknown suite(s) {', '.join(unknown)}; choose from {', '.join(SUITES + EXTRA_SUITES)}", file=sys.stderr)
        return 2
    started = dt.datetime.now(dt.UTC)
    results: list[dict[str, Any]] = []
    failed = False
    with _server(args.dsn) as (server_dsn, source):
        settings = server_settings(server_dsn)
        print(
            f"pgjobs bench: PostgreSQL {settings.get('server_version', '?')} ({source}), fsync={settings.get('fsync')},"
            f" synchronous_commit={settings.get('synchronous_commit')}, {os.cpu_count()} CPUs"
            f"{', quick' if args.quick else ''}",
            flush=True,
        )
        for name in names:
            print(f"running {name} ...", flush=True)
            try:
                results.append(_run_suite(name, server_dsn, args.quick))
            except Exception as exc:  # one broken suite must not hide the others' figures
                failed = True
                traceback.print_exc()
                results.append({"suite": name, "error": f"{type(exc).__name__}: {exc}", "figures": []})
    _print_table(results)
    path = Path(args.json) if args.json else RESULTS_DIR / f"{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "started_at": started.isoformat(),
        "quick": args.quick,
        "server": {"source": source, "settings": settings},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "git_commit": _git_commit(),
        "suites": results,
    }
    path.write_text(json.dumps(doc, indent=2, default=str))
    print(f"results written to {path}")
    if failed:
        return 1
    if args.fail_on_bars and any(f.get("passed") is False for r in results for f in r.get("figures", [])):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

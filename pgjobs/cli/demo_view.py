"""What ``pgjobs demo`` shows: the snapshots it reads, the live display, and the summary at the end."""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field
from typing import Any

import psycopg
from rich.console import Console, Group
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from pgjobs.cli.common import describe_progress, error_line, progress_fraction, short
from pgjobs.client import reports
from pgjobs.client.status import job_status_call
from pgjobs.records import JobState

SETTLED = ("succeeded", "failed", "cancelled")
STATE_STYLE = {
    "waiting": "dim",
    "scheduled": "yellow",
    "pending": "cyan",
    "active": "bold blue",
    "succeeded": "green",
    "failed": "bold red",
    "cancelled": "magenta",
}


# ---------------------------------------------------------------------------------------------------------
# what the display and the summary read


@dataclass
class Tracked:
    id: int
    kind: str
    state: str = "pending"
    attempt: int = 0
    progress: Any = None
    checkpoint: Any = None


@dataclass
class Snapshot:
    total: int
    by_state: dict[str, int]
    tracked: dict[int, Tracked]
    elapsed: float

    @property
    def settled(self) -> int:
        return sum(self.by_state.get(s, 0) for s in SETTLED)

    @property
    def done(self) -> bool:
        return self.settled >= self.total


@dataclass
class Run:
    """What one demo run did, for the summary."""

    target: str
    showcase: Any = None
    started: float = field(default_factory=time.perf_counter)
    snapshot: Snapshot | None = None
    events: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=7))
    event_count: int = 0
    finished: bool = False


async def read_snapshot(conn: psycopg.AsyncConnection[Any], run: Run) -> Snapshot:
    show = run.showcase
    by_state = {state: n for state, n in await reports.arun(conn, reports.state_counts(show.ids))}
    rows = await reports.arun(conn, reports.tracked([show.report_id, show.import_id]))
    tracked = {row[0]: Tracked(*row) for row in rows}
    return Snapshot(len(show.ids), by_state, tracked, time.perf_counter() - run.started)


# ---------------------------------------------------------------------------------------------------------
# the live display


def _bar(fraction: float, width: int = 32) -> ProgressBar:
    return ProgressBar(total=1000, completed=int(fraction * 1000), width=width)


def render(run: Run, snap: Snapshot) -> Group:
    grid = Table.grid(padding=(0, 1))
    grid.add_column(justify="right", style="bold")
    grid.add_column()
    grid.add_column()
    grid.add_row(
        "all jobs",
        _bar(snap.settled / max(snap.total, 1)),
        Text(f"{snap.settled}/{snap.total} settled  {snap.elapsed:4.1f} s"),
    )
    for tracked in snap.tracked.values():
        fraction = progress_fraction(tracked.progress) or (1.0 if tracked.state == "succeeded" else 0.0)
        label = tracked.kind.removeprefix("demo.")
        detail = f"{tracked.state}, attempt {tracked.attempt}"
        if tracked.progress is not None:
            detail += f", {describe_progress(tracked.progress)}"
        grid.add_row(label, _bar(fraction), Text(detail, style=STATE_STYLE.get(tracked.state, "")))
    states = Text("  ")
    for state in JobState:
        n = snap.by_state.get(state.value, 0)
        if n or state.value in ("pending", "active", "succeeded"):
            states.append(f"{state.value} {n}   ", style=STATE_STYLE.get(state.value, ""))
    parts: list[Any] = [grid, states]
    if run.events:
        parts.append(Text("status stream:", style="bold"))
        parts.extend(Text(f"  {line}", style="dim") for line in run.events)
    return Group(*parts)


def plain_line(snap: Snapshot) -> str:
    states = ", ".join(f"{s} {snap.by_state[s]}" for s in (st.value for st in JobState) if snap.by_state.get(s))
    tracked = "; ".join(
        f"{t.kind.removeprefix('demo.')} {t.state} {describe_progress(t.progress)}".rstrip()
        for t in snap.tracked.values()
    )
    return f"[{snap.elapsed:5.1f} s] {snap.settled}/{snap.total} settled ({states}); {tracked}"


def summary(dsn: str, run: Run, console: Console) -> None:
    show = run.showcase
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = reports.run(conn, reports.kind_summary(show.ids))
        span = reports.run(conn, reports.span(show.ids))
        job = reports.run(conn, job_status_call(show.report_id))
        report = None if job is None else (job.state.value, job.attempt, job.checkpoint, job.errors, job.result)
        failed = reports.run(conn, reports.first_failed(show.ids))

    kinds: dict[str, dict[str, int]] = {}
    totals: dict[str, int] = collections.Counter()
    attempts = errors = 0
    for kind, state, n, att, errs in rows:
        k = kinds.setdefault(kind, collections.Counter())
        k[state] += n
        k["attempts"] += att
        k["errors"] += errs
        totals[state] += n
        attempts += att
        errors += errs
    table = Table(title="summary", title_justify="left")
    table.add_column("kind")
    for col in ("jobs", "succeeded", "failed", "cancelled", "attempts", "errors"):
        table.add_column(col, justify="right")
    for kind, k in kinds.items():
        jobs = sum(k[s] for s in (st.value for st in JobState))
        table.add_row(
            kind,
            str(jobs),
            str(k["succeeded"]),
            str(k["failed"]),
            str(k["cancelled"]),
            str(k["attempts"]),
            str(k["errors"]),
        )
    table.add_row(
        "[bold]all[/]",
        str(len(show.ids)),
        str(totals["succeeded"]),
        str(totals["failed"]),
        str(totals["cancelled"]),
        str(attempts),
        str(errors),
        style="bold",
    )
    console.print(table)
    seconds, retried = span if span is not None else (None, 0)
    ran = len(show.ids) - totals["cancelled"]
    if seconds:
        console.print(
            f"{ran} jobs ran in {seconds:.1f} s, first enqueue to last completion: {ran / seconds:.0f} jobs/s with "
            f"{attempts} attempts. The handlers sleep on purpose and retries wait for their backoff; "
            "`pgjobs bench` measures raw throughput."
        )
    console.print(
        f"{retried} jobs needed more than one attempt; {errors} errors are kept in their jobs' history "
        f"(`pgjobs status ID`). {totals['failed']} jobs failed for good"
        + (f", e.g. {failed[0]}: {short(_last_line(failed[1]), 90)}" if failed else "")
        + f". {totals['cancelled']} job scheduled an hour ahead was cancelled before it ran."
    )
    if run.event_count:
        console.print(
            f"the status stream (pgjobs.read_events) delivered {run.event_count} transitions of the report, the "
            "import and the card charges; any process can follow a job the same way: pgjobs status ID --follow"
        )
    if report is not None:
        _report_story(console, show.report_id, report)


def _last_line(error: Any) -> str:
    """The exception line of a stored traceback, without the module path of the class."""
    lines = [x.strip() for x in error_line(str(error or "")).strip().splitlines() if x.strip()]
    last = lines[-1] if lines else "error"
    name, sep, rest = last.partition(": ")
    return f"{name.rsplit('.', 1)[-1]}{sep}{rest}" if sep and " " not in name else last


def _report_story(console: Console, job_id: int, report: tuple[Any, ...]) -> None:
    state, attempt, checkpoint, errors, _result = report
    runs = checkpoint.get("runs", []) if isinstance(checkpoint, dict) else []
    console.print(f"[bold]checkpoint story[/] of job {job_id} demo.nightly_report ({state} after {attempt} attempts):")
    crash_errors = {e.get("attempt"): e.get("error", "") for e in errors or [] if isinstance(e, dict)}
    seen: list[int] = []
    for i, r in enumerate(runs):
        first, last = int(r["first"]), int(r["last"])
        span = f"chunks {first}-{last}" if last >= first else "no chunk"
        how = "started from the beginning" if i == 0 else f"resumed from its checkpoint at chunk {first}"
        line = f"  attempt {r['attempt']}: {how}, ran {span}"
        if r.get("crashed"):
            line += f", then crashed ({short(_last_line(crash_errors.get(r['attempt'])), 100)})"
        console.print(line)
        seen.extend(range(first, last + 1))
    if runs:
        once = len(seen) == len(set(seen))
        console.print(
            "  every chunk ran exactly once: the work done before the crash was not redone"
            if once
            else "  [yellow]some chunks ran twice[/] (a crash between a chunk and its checkpoint)"
        )

"""Cron arithmetic for recurring jobs: when does a schedule fire next, in its IANA time zone.

A cron expression is matched against the *wall-clock* time of the schedule's zone (croniter does the
matching, on naive local times), and every matching wall time becomes one instant. Daylight-saving
transitions follow one documented rule:

* **Gap** (clocks jump forward, e.g. 02:00 -> 03:00 in Europe/Paris on the last Sunday of March): a wall
  time inside the gap does not exist. It runs once, at the first instant after the gap (03:00 local).
  Several nonexistent times (``*/15`` at 02:00, 02:15, 02:30, 02:45) collapse into that single run, and
  it is the same run as a regular fire at that instant (03:00 for ``*/15``).
* **Repeat** (clocks fall back, e.g. 03:00 -> 02:00 in Europe/Paris on the last Sunday of October): a wall
  time that occurs twice runs once, at its first occurrence (``fold=0``, summer time). During the
  repeated hour nothing fires a second time.

So every run is an instant, runs are strictly increasing, and no wall time ever runs twice.

Six fields put **seconds first**, as Oban, Quartz and node-cron do: ``"*/5 * * * * *"`` fires every five
seconds, ``"30 0 * * * *"`` at 30 s past every hour. A seventh field is the year. Five fields are the
classic ``minute hour day month weekday``.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from croniter.croniter import CroniterError

from pgjobs.errors import InvalidArgument

# How many cron matches next_fire looks through before it gives up. Only reached by expressions that
# match nothing reachable, or by many matches that collapse (a gap, a repeated hour) -- far below this.
_MAX_STEPS = 10_000


@lru_cache(maxsize=512)
def zone(name: str) -> ZoneInfo:
    """The IANA zone ``name``, or InvalidArgument naming it."""
    if not name:
        raise InvalidArgument(f"timezone must be an IANA time zone name, got {name!r}")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise InvalidArgument(f"unknown time zone {name!r} (expected an IANA name such as 'Europe/Paris')") from exc


def check_cron(expr: str) -> None:
    """Raises InvalidArgument unless ``expr`` is a cron expression croniter accepts (5 fields; 6 with
    seconds first; 7 with a year last; or ``@hourly``/``@daily``/... aliases) and that fires at all."""
    if not expr or not expr.strip() or not croniter.is_valid(expr, second_at_beginning=True):
        raise InvalidArgument(
            f"invalid cron expression {expr!r} (expected 'minute hour day month weekday', or six fields with "
            "seconds first: '*/5 * * * * *' is every 5 seconds)"
        )
    try:
        _iter(expr, datetime(2000, 1, 1)).get_next(datetime)
    except CroniterError as exc:
        raise InvalidArgument(f"cron expression {expr!r} never fires") from exc


def _iter(expr: str, start: datetime) -> croniter:
    """croniter over naive wall times, reading a six-field expression with its seconds first."""
    return croniter(expr, start, second_at_beginning=True)


def _aware(value: datetime) -> datetime:
    if value.tzinfo is None:
        raise ValueError(f"expected a timezone-aware datetime, got naive {value!r}")
    return value


def resolve(wall: datetime, tz: ZoneInfo) -> datetime:
    """The instant (UTC) at which the naive local time ``wall`` runs, by the DST rule of this module."""
    first = wall.replace(tzinfo=tz, fold=0).astimezone(UTC)
    if first.astimezone(tz).replace(tzinfo=None) == wall:
        return first  # exists; when it is ambiguous, fold=0 is its first occurrence
    # Nonexistent (in a gap). fold=0 applies the offset from before the gap and lands after it; fold=1
    # applies the offset from after the gap and lands before it. The gap's end, the transition, lies
    # in between: the earliest instant whose offset is the post-gap offset.
    lo = wall.replace(tzinfo=tz, fold=1).astimezone(UTC)
    hi = first
    after_offset = hi.astimezone(tz).utcoffset()
    while hi - lo > timedelta(seconds=1):
        mid = lo + (hi - lo) / 2
        mid = mid.replace(microsecond=0) if mid.microsecond else mid
        if mid.astimezone(tz).utcoffset() == after_offset:
            hi = mid
        else:
            lo = mid
    return hi


def fires(cron: str, timezone: str, after: datetime) -> Iterator[datetime]:
    """The runs of ``cron`` in ``timezone`` strictly after the instant ``after``, as UTC instants, in
    increasing order, each once (the DST rule of this module applied)."""
    tz = zone(timezone)
    after = _aware(after).astimezone(UTC)
    start = after.astimezone(tz).replace(tzinfo=None)
    try:
        it = _iter(cron, start)
    except CroniterError as exc:
        raise InvalidArgument(f"invalid cron expression {cron!r}") from exc
    last = after
    misses = 0
    while misses < _MAX_STEPS:
        try:
            wall = it.get_next(datetime)
        except CroniterError as exc:
            raise InvalidArgument(f"cron expression {cron!r} has no run after {after.isoformat()}") from exc
        instant = resolve(wall, tz)
        # Collapsed matches (a gap) and second occurrences (iterating from inside a repeated hour)
        # resolve to an instant already passed: skip them.
        if instant <= last:
            misses += 1
        else:
            misses = 0
            last = instant
            yield instant
            # restart the iteration at the run's own wall time: after a gap that is the gap's end, so
            # the remaining matches inside the gap are not visited again
            new_start = instant.astimezone(tz).replace(tzinfo=None)
            if new_start > wall:
                it = _iter(cron, new_start)
    raise InvalidArgument(f"cron expression {cron!r} has no run after {after.isoformat()} in {timezone!r}")


def next_fire(cron: str, timezone: str, after: datetime) -> datetime:
    """The first run of ``cron`` in ``timezone`` strictly after the instant ``after`` (a UTC datetime)."""
    return next(fires(cron, timezone, after))

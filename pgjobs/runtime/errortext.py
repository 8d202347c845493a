"""The error text a failed attempt stores: the handler's traceback, without the frames of the machinery
that called it.

A handler's exception travels through the worker's runner and, for a plain function, anyio's worker
thread: four frames of pgjobs and anyio before the first line of the user's code, on every traceback the
CLI and the dashboard show. Those leading frames are left out (a line says how many); every frame from
the first one outside that machinery on is kept, the libraries the handler called included.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import traceback
from pathlib import Path
from typing import Any

import anyio

_RUNTIME = Path(__file__).resolve().parent
_INTERNAL_DIRS = tuple(
    str(p) + "/"
    for p in (
        _RUNTIME,  # the runner, the job context
        _RUNTIME.parent / "testing",  # perform_job
        Path(anyio.__file__).resolve().parent,
        Path(asyncio.__file__).resolve().parent,
        Path(concurrent.futures.__file__).resolve().parent,
    )
)
_INTERNAL_FILES = frozenset(str(Path(m.__file__ or "").resolve()) for m in (threading, contextlib))


def _internal(filename: str) -> bool:
    path = str(Path(filename).resolve()) if filename and not filename.startswith("<") else filename
    return path.startswith(_INTERNAL_DIRS) or path in _INTERNAL_FILES


class _Trimmed(traceback.StackSummary):
    """A stack whose leading internal frames were left out; its text says how many."""

    hidden = 0

    def format(self, *args: Any, **kwargs: Any) -> list[str]:
        lines: list[str] = super().format(*args, **kwargs)
        if self.hidden:
            plural = "s" if self.hidden > 1 else ""
            lines.insert(0, f"  ({self.hidden} frame{plural} of the pgjobs worker and anyio left out)\n")
        return lines


def _trim(te: traceback.TracebackException, seen: set[int]) -> None:
    if id(te) in seen:
        return
    seen.add(id(te))
    frames = list(te.stack)
    first_own = next((i for i, f in enumerate(frames) if not _internal(f.filename)), None)
    if first_own:  # (None: nothing but internal frames, kept as they are; 0: nothing to leave out)
        trimmed = _Trimmed(frames[first_own:])
        trimmed.hidden = first_own
        te.stack = trimmed
    for linked in (te.__cause__, te.__context__, *(getattr(te, "exceptions", None) or ())):
        if linked is not None:
            _trim(linked, seen)


def handler_traceback(error: BaseException) -> str:
    """The traceback of ``error`` as a failed attempt stores it, from the handler's own frames on."""
    te = traceback.TracebackException.from_exception(error)
    _trim(te, set())
    return "".join(te.format()).rstrip()

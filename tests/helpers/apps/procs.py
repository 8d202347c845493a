"""Starting worker processes (tests/helpers/apps/worker_app.py) from tests, and waiting on the database."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
APP = REPO / "tests" / "helpers" / "apps" / "worker_app.py"

StartWorker = Callable[..., subprocess.Popen[bytes]]


@contextmanager
def worker_processes(dsn: str, log_dir: Path, app: Path = APP) -> Iterator[StartWorker]:
    """Yields ``start(**options)`` that starts ``app`` (``worker_app.py``) with those Worker options. Every process
    still running at exit is killed; the logs are written to stderr (pytest shows them for failed tests)."""
    procs: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(**options: Any) -> subprocess.Popen[bytes]:
        log = log_dir / f"worker-{len(procs)}.log"
        env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, str(app), dsn, json.dumps(options)], cwd=REPO, env=env, stdout=out, stderr=out
            )
        procs.append((proc, log))
        return proc

    try:
        yield start
    finally:
        for proc, log in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
            sys.stderr.write(
                f"--- {log.name} (exit {proc.returncode}) ---\n{log.read_text(errors='replace')[-4000:]}\n"
            )


def wait_for(check: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    """Polls ``check()`` until it returns something truthy (returned), or fails after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")

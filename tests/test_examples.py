"""Every program in ``examples/`` runs against a fresh migrated database and prints what it should, and every
Python snippet in README.md is free of undefined names (ruff F821).

Each example gets the database through ``PGJOBS_DSN``, runs in a subprocess with a timeout, and is checked
by the lines its output must contain.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
TIMEOUT = 90

# example -> substrings its output must contain
EXPECTED: dict[str, list[str]] = {
    "quickstart.py": [
        "send_email: succeeded in queue emails, attempt 1 of 5",  # the declared queue and max_attempts
        "resize: succeeded in queue default, attempt 1 of 20",
        "outbox: ['Welcome -> ada@example.com']",
    ],
    "transactional_enqueue.py": [
        "ada@example.com: job 1 created=True in queue emails",
        "bob@example.com: rolled back (something after the enqueue failed)",
        "second enqueue of the same unique key: job 1 created=False",
        "jobs for: ['ada@example.com']",
    ],
    "enqueue_many.py": [
        "a: job 1 fetch in default, pending",
        "b: job 2 fetch in slow, pending",
        "m: job 3 merge in default, waiting",
        "r: job 5 report in default, pending",
        "all or nothing: GraphError, 0 'ok' jobs enqueued",
    ],
    "workflow.py": ["zip: succeeded, 10 files, first thumbs/0.png", "batch succeeded: 11 of 11 succeeded"],
    "status_stream.py": ["pending", "active {'done': 1, 'total': 3}", "succeeded", "result: {'imported': 300}"],
    "fair_queues.py": ["first four served: ABCD", "B, C and D were done after 8 of 36 jobs"],
    "schedules.py": [
        "nightly-report next runs at ",
        "heartbeat ran 3 times, one second apart: True",
        "schedules: ['heartbeat']",
    ],
    "retries_and_snoozes.py": [
        "email: succeeded after 2 attempt(s), result sent on attempt 2, errors ['retry requested (after 0.2)']",
        "flaky: failed after 2 attempt(s), result None, errors ['ValueError: boom on attempt 1', "
        "'ValueError: boom on attempt 2']",
    ],
    "checkpoints.py": [
        "attempt 1 ran chunks [0, 1, 2]",
        "attempt 2 ran chunks [3, 4, 5]",
        "every chunk ran once: True",
    ],
    "sql_api.sql": [
        " completed \n-----------\n t",
        " completed_again \n-----------------\n f",
        '  1 | succeeded |       1 | {"sent": true}',
        " zip        | waiting",
        " loaded \n--------\n      3",
        "PJ002: job: kind must be a non-empty string, got ''",
    ],
    "order_saga.py": [
        "order 42 parked (scheduled), waiting for shipped:42",
        "psql: signal woke 1 job(s)",
        "order 42: succeeded, mail to ada@example.com: shipped with DHL",
        "steps done: ['charge', 'mail'], the card charged 1 time(s)",
    ],
    "sql_worker.sh": ["job 1: HELLO", "job 2: WORLD", "job 3: failed (no word)", "succeeded: 2", "failed: 1"],
}


def _command(name: str, dsn: str) -> list[str]:
    path = str(EXAMPLES / name)
    if name.endswith(".py"):
        return [sys.executable, path]
    if name.endswith(".sql"):
        return ["psql", dsn, "-X", "-v", "ON_ERROR_STOP=1", "-f", path]
    return ["bash", path]


def test_every_example_is_checked() -> None:
    on_disk = sorted(p.name for p in EXAMPLES.iterdir() if p.suffix in (".py", ".sql", ".sh"))
    assert on_disk == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_runs(name: str, dsn: str) -> None:
    if not name.endswith(".py") and shutil.which("psql") is None:
        pytest.skip("psql is not installed (Debian package postgresql-client)")
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env["PGJOBS_DSN"] = dsn
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    proc = subprocess.run(_command(name, dsn), cwd=REPO, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    for line in EXPECTED[name]:
        assert line in output, f"{name}: {line!r} not in:\n{output}"


def _readme_python_blocks() -> list[str]:
    text = (REPO / "README.md").read_text()
    return re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)


def test_readme_python_snippets_have_no_undefined_names() -> None:
    if shutil.which("ruff") is None and not (Path(sys.executable).parent / "ruff").exists():
        pytest.skip("ruff is not installed")
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    blocks = _readme_python_blocks()
    assert len(blocks) >= 8
    problems = []
    for i, block in enumerate(blocks):
        proc = subprocess.run(
            [ruff, "check", "--isolated", "--select", "F821,F811", "--output-format", "concise",
             "--stdin-filename", f"readme_block_{i}.py", "-"],
            input=block, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        if proc.returncode != 0:
            problems.append(f"block {i} ({block.splitlines()[0]!r}):\n{proc.stdout}")
    assert not problems, "\n".join(problems)


def test_readme_points_to_every_example() -> None:
    """README.md, or a page of docs/ for an example that belongs to one topic (docs/durable-execution.md)."""
    text = (REPO / "README.md").read_text() + "".join(p.read_text() for p in sorted((REPO / "docs").glob("*.md")))
    missing = [name for name in EXPECTED if f"examples/{name}" not in text]
    assert not missing, f"neither README.md nor docs/ mention {missing}"


def test_docs_exist_are_linked_and_draw_both_state_machines() -> None:
    readme = (REPO / "README.md").read_text()
    for page in ("docs/states.md", "docs/deploying.md", "docs/coming-from.md"):
        assert (REPO / page).is_file() and f"]({page})" in readme, page
    states = (REPO / "docs/states.md").read_text()
    assert states.count("```mermaid\nstateDiagram-v2") == 2
    from pgjobs.records import JobState

    for state in JobState:  # every job state appears in the diagram
        assert f"--> {state.value}" in states, state

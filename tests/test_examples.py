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
        "render_frames: succeeded in queue default, attempt 1 of 20",
        "outbox: ['Welcome -> ada@example.com']",
    ],
    "transactional_enqueue.py": [
        "ada@example.com: job 1 created=True in queue emails",
        "bob@example.com: rolled back (something after the enqueue failed)",
        "second enqueue of the same unique key: job 1 created=False",
        "jobs for: ['ada@example.com']",
    ],
    "enqueue_many.py": [
        "a: job 1 fetch_page in default, pending",
        "b: job 2 fetch_page in slow, pending",
        "m: job 3 merge_pages in default, waiting",
        "r: job 5 daily_report in default, pending",
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
        "reminder_email: succeeded after 2 attempt(s), result sent on attempt 2, "
        "errors ['retry requested (after 0.2)']",
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
        " ocr_scan  | waiting",
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


def _manual_pages() -> list[Path]:
    """README.md and every page of docs/ (the generated SQL reference has no snippets of its own)."""
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def _blocks(lang: str, pages: list[Path] | None = None) -> list[tuple[str, str]]:
    """(where, code) of every fenced block of ``lang`` in ``pages``."""
    found = []
    for page in pages if pages is not None else _manual_pages():
        for i, block in enumerate(re.findall(rf"```{lang}\n(.*?)```", page.read_text(), flags=re.DOTALL)):
            found.append((f"{page.relative_to(REPO)} {lang} block {i}", block))
    return found


def test_readme_and_docs_python_snippets_have_no_undefined_names() -> None:
    if shutil.which("ruff") is None and not (Path(sys.executable).parent / "ruff").exists():
        pytest.skip("ruff is not installed")
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    blocks = _blocks("python")
    assert len(blocks) >= 8
    problems = []
    for where, block in blocks:
        proc = subprocess.run(
            [ruff, "check", "--isolated", "--select", "F821,F811", "--output-format", "concise",
             "--stdin-filename", "snippet.py", "-"],
            input=block, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        if proc.returncode != 0:
            problems.append(f"{where} ({block.splitlines()[0]!r}):\n{proc.stdout}")
    assert not problems, "\n".join(problems)


def test_readme_sql_blocks_run_in_psql(dsn: str) -> None:
    """Every SQL block of README.md runs as written, one after another, in a fresh migrated database."""
    if shutil.which("psql") is None:
        pytest.skip("psql is not installed (Debian package postgresql-client)")
    blocks = _blocks("sql", [REPO / "README.md"])
    assert blocks
    for where, block in blocks:
        proc = subprocess.run(["psql", dsn, "-X", "-v", "ON_ERROR_STOP=1"], input=block, capture_output=True,
                              text=True, timeout=TIMEOUT)  # fmt: skip
        assert proc.returncode == 0, f"{where}:\n{proc.stdout}{proc.stderr}"


# What names a job kind in a program or a snippet: a handler, an enqueue, a job spec, a schedule's kind.
_KIND = re.compile(
    r"""(?:job|enqueue|then)\(\s*["']([\w.-]+)["']"""
    r'|"kind":\s*"([\w.-]+)"'
    r'|add_schedule\(\s*"[^"]+",\s*"([\w.-]+)"'
    r"|kinds\s*=>\s*ARRAY\['([\w.-]+)'"
    r"|upsert_schedule\('[^']+',\s*'([\w.-]+)'"
)
_HANDLER = re.compile(r'job\(\s*"([\w.-]+)"')


def _kinds(text: str) -> set[str]:
    return {next(g for g in m.groups() if g) for m in _KIND.finditer(text)}


def test_every_example_and_snippet_has_kind_names_of_its_own() -> None:
    """Two programs run against one database must not hand each other jobs: a worker of one claims the
    other's jobs of a shared kind and fails them. So no kind appears in two examples, and a snippet in the
    README or docs/ uses no kind of an example unless it names that example (it is that program)."""
    programs = {f"examples/{name}": (EXAMPLES / name).read_text() for name in EXPECTED}
    owner: dict[str, str] = {}
    shared = []
    for where, text in programs.items():
        for kind in sorted(_kinds(text)):
            if kind in owner:
                shared.append(f"{kind!r} in {owner[kind]} and {where}")
            owner.setdefault(kind, where)
    declared: dict[str, str] = {}
    for lang in ("python", "sql"):
        for where, block in _blocks(lang):
            mirrors = {p for p in programs if p in block}
            for kind in sorted(_kinds(block)):
                if kind in owner and owner[kind] not in mirrors:
                    shared.append(f"{kind!r} in {owner[kind]} and {where}")
            for kind in _HANDLER.findall(block):
                if kind in declared and not mirrors:
                    shared.append(f"handler {kind!r} declared in {declared[kind]} and {where}")
                declared.setdefault(kind, where)
    assert not shared, "kinds shared between programs (give each its own):\n" + "\n".join(shared)


def test_readme_points_to_every_example() -> None:
    text = (REPO / "README.md").read_text()
    missing = [name for name in EXPECTED if f"examples/{name}" not in text]
    assert not missing, f"README.md does not mention {missing}"


def test_docs_exist_are_linked_and_draw_both_state_machines() -> None:
    readme = (REPO / "README.md").read_text()
    for page in ("docs/states.md", "docs/deploying.md", "docs/coming-from.md"):
        assert (REPO / page).is_file() and f"]({page})" in readme, page
    states = (REPO / "docs/states.md").read_text()
    assert states.count("```mermaid\nstateDiagram-v2") == 2
    from pgjobs.records import JobState

    for state in JobState:  # every job state appears in the diagram
        assert f"--> {state.value}" in states, state

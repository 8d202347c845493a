"""The tree says what is true now; its history lives in git. No dates, run letters or issue numbers in the
README, in docs/ (except the one dated table of docs/benchmarks/results.md, and the benchmark summary table
of the README, which must say when and on which commit each figure was measured), in the comments of sql/,
or in test names; no first-person notes in the prose of the manual."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "docs" / "benchmarks" / "results.md"
SQL_NOT_CHECKED: set[str] = set()

DIARY = {
    "a date": re.compile(r"\b20\d\d-\d\d-\d\d\b"),
    "an issue number": re.compile(r"\bissues? #?\d+|(?<![\w&/])#\d+\b", re.IGNORECASE),
    "a run letter": re.compile(r"\b[Rr]uns? [A-Z](?:-[A-Z])?\b(?!/)|\b[A-Z]'s (?:code|run|probe|claims?)\b"),
}
FIRST_PERSON = re.compile(r"\b(?:I(?!/)|I'm|I've|my|me)\b")


def _problems(where: str, lines: list[str], first_person: bool = False) -> list[str]:
    found = []
    for n, line in enumerate(lines, 1):
        for what, pattern in DIARY.items():
            if m := pattern.search(line):
                found.append(f"{where}:{n}: {what} ({m.group(0)!r}): {line.strip()[:100]}")
        prose = re.sub(r"`[^`]*`", "", line)
        if first_person and (m := FIRST_PERSON.search(prose)):
            found.append(f"{where}:{n}: first person ({m.group(0)!r}): {line.strip()[:100]}")
    return found


def _prose_lines(text: str) -> list[str]:
    """The page's lines with fenced code blanked (line numbers kept)."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            out.append("")
        else:
            out.append("" if fenced else line)
    return out


def _without_dated_table(lines: list[str], after_heading: str | None) -> list[str]:
    """``lines`` with the rows of the first table (after ``after_heading`` when given) blanked."""
    start = 0 if after_heading is None else lines.index(after_heading)
    out, seen_table, in_table = list(lines), False, False
    for i in range(start, len(lines)):
        is_row = lines[i].startswith("|")
        if is_row and not seen_table:
            seen_table = in_table = True
        if in_table and is_row:
            out[i] = ""
        elif in_table:
            break
    return out


def test_readme_and_docs_tell_no_history() -> None:
    problems = []
    readme = (REPO / "README.md").read_text().splitlines()
    problems += _problems("README.md", _without_dated_table(_prose_lines("\n".join(readme)), "## Benchmarks"), True)
    for page in sorted((REPO / "docs").rglob("*.md")):
        lines = _prose_lines(page.read_text())
        if page == RESULTS:
            lines = _without_dated_table(lines, None)
        problems += _problems(str(page.relative_to(REPO)), lines, first_person=True)
    assert not problems, "history belongs in git, not in the manual:\n" + "\n".join(problems)


def test_benchmark_results_are_one_dated_table() -> None:
    lines = RESULTS.read_text().splitlines()
    tables = sum(1 for i, line in enumerate(lines) if line.startswith("|") and not lines[i - 1].startswith("|"))
    assert tables == 1
    rows = [line for line in lines if line.startswith("|")][2:]
    assert rows and all(DIARY["a date"].search(row) for row in rows), "every figure says when it was measured"


def _sql_comments(text: str) -> list[str]:
    """Each line's comment (from ``--`` on; the text before it blanked, line numbers kept)."""
    return [line[line.index("--") :] if "--" in line else "" for line in text.splitlines()]


def test_sql_comments_tell_no_history() -> None:
    problems = []
    for f in sorted((REPO / "sql").glob("*.sql")):
        if f.name not in SQL_NOT_CHECKED:
            problems += _problems(f"sql/{f.name}", _sql_comments(f.read_text()))
    assert not problems, "comments say what is true now and why; history belongs in git:\n" + "\n".join(problems)


def test_test_names_tell_no_history() -> None:
    name = re.compile(r"^\s*(?:async\s+)?def (test_\w+)", re.MULTILINE)
    diary = re.compile(r"issue_?\d+|20\d\d_?\d\d_?\d\d|_run_[a-z]_|_run_[a-z]$", re.IGNORECASE)
    problems = []
    for f in sorted((REPO / "tests").rglob("*.py")):
        where = str(f.relative_to(REPO))
        if diary.search(f.name):
            problems.append(where)
        problems += [f"{where}: {n}" for n in name.findall(f.read_text()) if diary.search(n)]
    assert not problems, "test names say what they check, not when or for which issue:\n" + "\n".join(problems)


def test_the_checks_catch_what_they_look_for() -> None:
    diary_lines = ["measured on 2026-12-06", "(issue 14)", "see #39", "run O: N's code again", "runs A-O"]
    assert all(_problems("x", [line]) for line in diary_lines)
    assert _problems("x", ["when I stopped the run"], first_person=True)
    clean = ["an A/B pair", "`'9999-12-31'` still means far future", "see [limits](#limits)", "I/O bound"]
    assert not [p for line in clean for p in _problems("x", [line], first_person=True)]

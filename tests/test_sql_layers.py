"""The layers of ``sql/``, checked from its text (no database), as tests/test_layout.py checks the package's:

* every function file is in the declared order of docs/design/sql-layers.md (bottom first);
* a function calls only functions of its own file or of files below it (bare and ``pgjobs.``-qualified
  names followed by ``(``, in function bodies and top-level statements alike, comments stripped, string
  literals kept: a name in an EXECUTE string is a call too);
* the files have no cycles of calls;
* no file is over 1,200 lines.

(tests/sql/test_sql_layout.py checks the functions themselves: their length and search_path.)

The scan is tested on planted files as well, so a scan that finds nothing cannot pass for a clean tree.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SQL_DIR = ROOT / "sql"
ORDER_DOC = ROOT / "docs" / "design" / "sql-layers.md"

MAX_FILE_LINES = 1200
# Files that define no function: the tables, the reference comments and the grants name functions only.
OUTSIDE = ("schema.sql", "api_comments.sql", "roles.sql")

# Calls up the order allowed for a reason: (caller, callee) -> reason. None now; the self-tests below keep the
# mechanism (and test_each_known_exception_is_still_needed keeps every entry real).
KNOWN_UPWARD: dict[tuple[str, str], str] = {}
SIZE_ALLOWED: dict[str, str] = {}

_DEFINITION = re.compile(r"\bCREATE\s+(?:OR\s+REPLACE\s+)?(?:FUNCTION|PROCEDURE)\s+pgjobs\.(\w+)\s*\(", re.I)
_LISTED = re.compile(r"^\d+\.\s+`(\w+\.sql)`", re.M)


def declared_order() -> list[str]:
    return _LISTED.findall(ORDER_DOC.read_text())


def strip_comments(text: str) -> str:
    """``--`` and ``/* */`` comments blanked (newlines kept, so positions and line numbers hold); quoted
    strings and identifiers kept whole, so a ``--`` inside one is not a comment."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("--", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "'\"":
            j = i + 1
            while j < n and (text[j] != c or text[j + 1 : j + 2] == c):
                j += 2 if text[j] == c else 1
            out.append(text[i : j + 1])
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def scan(texts: dict[str, str]) -> tuple[dict[str, str], list[tuple[str, str, str, str]]]:
    """From ``{file name: text}``: where each function is defined, and every call between two different
    files as ``(caller file, caller function, callee file, callee)``; a call outside any function body
    has the caller ``(top level)``."""
    stripped = {f: strip_comments(t) for f, t in texts.items()}
    defined: dict[str, str] = {}
    spans: dict[str, list[tuple[int, str]]] = {}
    for f, t in stripped.items():
        spans[f] = [(m.start(), m.group(1)) for m in _DEFINITION.finditer(t)]
        for _, name in spans[f]:
            defined.setdefault(name, f)
    if not defined:
        return defined, []
    names = sorted(defined, key=len, reverse=True)
    call = re.compile(r"(?<![\w.$])(?:pgjobs\.)?(" + "|".join(map(re.escape, names)) + r")\s*\(")
    calls: list[tuple[str, str, str, str]] = []
    for f, t in stripped.items():
        starts = spans[f]
        defs = {m.start(1) for m in _DEFINITION.finditer(t)}
        for m in call.finditer(t):
            if m.start(1) in defs or defined[m.group(1)] == f:
                continue
            caller = next((name for start, name in reversed(starts) if start < m.start()), "(top level)")
            calls.append((f, caller, defined[m.group(1)], m.group(1)))
    return defined, calls


def upward_calls(order: list[str], calls: list[tuple[str, str, str, str]]) -> list[tuple[str, str, str, str]]:
    rank = {f: i for i, f in enumerate(order)}
    return [c for c in calls if rank[c[2]] > rank[c[0]]]


def file_cycles(calls: list[tuple[str, str, str, str]]) -> list[list[str]]:
    """The strongly connected sets of two or more files of the call graph (Tarjan), each sorted."""
    graph: dict[str, set[str]] = defaultdict(set)
    for a, _, b, _ in calls:
        graph[a].add(b)
        graph.setdefault(b, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            members: list[str] = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                members.append(w)
                if w == v:
                    break
            if len(members) > 1:
                found.append(sorted(members))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def _tree() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(SQL_DIR.glob("*.sql")) if p.name not in OUTSIDE}


def _unknown(calls: list[tuple[str, str, str, str]]) -> list[tuple[str, str, str, str]]:
    return [c for c in calls if (c[1], c[3]) not in KNOWN_UPWARD]


def test_every_function_file_is_in_the_declared_order_once() -> None:
    order = declared_order()
    assert len(order) == len(set(order)), order
    files = set(_tree())
    assert sorted(files - set(order)) == [], "add these to docs/design/sql-layers.md"
    assert sorted(set(order) - files) == [], "listed in docs/design/sql-layers.md but not in sql/"
    for name in OUTSIDE:
        assert not _DEFINITION.search(strip_comments((SQL_DIR / name).read_text())), name


def test_calls_point_down_the_declared_order() -> None:
    _, calls = scan(_tree())
    assert calls, "the scan found no call between files: it is broken"
    wrong = [f"{a} {caller}() -> {b} {callee}()" for a, caller, b, callee in upward_calls(declared_order(), calls)]
    known = {f"{a} {caller}() -> {b} {callee}()" for a, caller, b, callee in calls if (caller, callee) in KNOWN_UPWARD}
    assert sorted(set(wrong) - known) == []


def test_no_cycles_between_files() -> None:
    _, calls = scan(_tree())
    assert file_cycles(_unknown(calls)) == []
    assert file_cycles(calls) == []


def test_each_known_exception_is_still_needed() -> None:
    defined, calls = scan(_tree())
    rank = {f: i for i, f in enumerate(declared_order())}
    seen = {(caller, callee) for _, caller, _, callee in calls}
    for (caller, callee), reason in KNOWN_UPWARD.items():
        assert reason
        assert (caller, callee) in seen, f"{caller} no longer calls {callee}: drop it from KNOWN_UPWARD"
        assert rank[defined[callee]] > rank[defined[caller]], f"{caller} -> {callee} points down now"
    for name, reason in SIZE_ALLOWED.items():
        assert reason
        path = SQL_DIR / name
        assert path.exists() and len(path.read_text().splitlines()) > MAX_FILE_LINES, f"drop {name} from SIZE_ALLOWED"


@pytest.mark.parametrize("path", sorted(SQL_DIR.glob("*.sql")), ids=lambda p: p.name)
def test_file_size(path: Path) -> None:
    if path.name in SIZE_ALLOWED:
        return
    assert len(path.read_text().splitlines()) <= MAX_FILE_LINES, f"{path.name}: split it by concern"


_PLANTED = {
    "low.sql": """
-- low.sql's helper calls up: high_thing() is named here only in a comment, pgjobs.high_thing(1) too
CREATE OR REPLACE FUNCTION pgjobs._low(x int) RETURNS int LANGUAGE sql AS $$
    SELECT pgjobs.high_thing(x) /* a block comment: _low_only(x) */ + length('--') + _low_only(x);
$$;
CREATE FUNCTION pgjobs._low_only(x int) RETURNS int LANGUAGE sql AS $$ SELECT x $$;
""",
    "high.sql": """
CREATE OR REPLACE FUNCTION pgjobs.high_thing(x int) RETURNS int LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('SELECT %s', 1);
    RETURN _low(x) + v._low(x);  -- v._low is a column, not a call
END;
$$;
""",
    "side.sql": """
CREATE OR REPLACE FUNCTION pgjobs.side() RETURNS int LANGUAGE sql AS $$ SELECT high_thing (1) $$;
""",
}


def test_the_scan_finds_a_planted_cycle_and_upward_call() -> None:
    defined, calls = scan(_PLANTED)
    assert defined == {"_low": "low.sql", "_low_only": "low.sql", "high_thing": "high.sql", "side": "side.sql"}
    assert sorted(calls) == [
        ("high.sql", "high_thing", "low.sql", "_low"),
        ("low.sql", "_low", "high.sql", "high_thing"),
        ("side.sql", "side", "high.sql", "high_thing"),
    ]
    assert file_cycles(calls) == [["high.sql", "low.sql"]]
    assert upward_calls(["low.sql", "high.sql", "side.sql"], calls) == [("low.sql", "_low", "high.sql", "high_thing")]
    assert file_cycles([c for c in calls if c[0] != "low.sql"]) == []


def test_comment_stripping_keeps_strings_and_lines() -> None:
    text = "a -- b(\n'it''s -- not' /* c(\n d( */ e\n"
    out = strip_comments(text)
    assert out.count("\n") == text.count("\n") and len(out) == len(text)
    assert "'it''s -- not'" in out and "b(" not in out and "d(" not in out and out.rstrip().endswith("e")

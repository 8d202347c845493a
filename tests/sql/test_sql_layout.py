"""The shape of ``sql/``: no PL/pgSQL function over 250 lines, and every routine pins its search_path.

A function is measured from its ``CREATE OR REPLACE FUNCTION`` line to the line that closes its body
(``$$;``), both included. The parser is checked against the database: it must find every routine that
installing ``sql/`` creates (so a function it cannot read fails the test rather than escaping it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tests.helpers.foundation import Conn

SQL_DIR = Path(__file__).resolve().parents[2] / "sql"
MAX_LINES = 250
SEARCH_PATH = "pg_catalog, pgjobs, pg_temp"

_CREATE = re.compile(
    r"^[ \t]*CREATE\s+(?:OR\s+REPLACE\s+)?(FUNCTION|PROCEDURE)\s+(?P<name>[\w.\"]+)\s*\(", re.IGNORECASE | re.MULTILINE
)
_BODY_START = re.compile(r"\bAS\s+(\$\w*\$)", re.IGNORECASE)
_LANGUAGE = re.compile(r"\bLANGUAGE\s+(?P<lang>\w+)", re.IGNORECASE)
_SET_PATH = re.compile(r"^[ \t]*SET\s+search_path\s*(?:=|TO)\s*(?P<path>[^\n]+?)\s*$", re.IGNORECASE | re.MULTILINE)


@dataclass(frozen=True)
class Routine:
    file: str
    name: str
    line: int  # of the CREATE
    lines: int  # CREATE line to the closing "$$;" line, both included
    search_path: str | None  # as the SET clause writes it, or None
    language: str | None = None  # as the LANGUAGE clause writes it, lower case

    def where(self) -> str:
        return f"{self.file}:{self.line} {self.name}"


def parse(text: str, file: str) -> list[Routine]:
    """Every routine a file of ``sql/`` creates. Comments and string literals before a body do not
    contain a CREATE at the start of a line in these files; a body's own text is skipped as a whole."""
    found: list[Routine] = []
    pos = 0
    while m := _CREATE.search(text, pos):
        start = _BODY_START.search(text, m.end())
        assert start, f"{file}: no body after {m.group('name')}"
        tag = start.group(1)
        end = text.find(tag, start.end())
        assert end >= 0, f"{file}: the body of {m.group('name')} is not closed by {tag}"
        close = text.find(";", end + len(tag))
        assert close >= 0 and text[end + len(tag) : close].strip() == "", f"{file}: {tag} of {m.group('name')}"
        header = text[m.start() : start.start()]
        path = _SET_PATH.search(header)
        first = text.count("\n", 0, m.start()) + 1
        last = text.count("\n", 0, close) + 1
        name = m.group("name").replace('"', "").lower()
        lang = _LANGUAGE.search(header)
        found.append(
            Routine(
                file, name, first, last - first + 1, path.group("path") if path else None,
                lang.group("lang").lower() if lang else None,
            )
        )  # fmt: skip
        pos = close + 1
    return found


def routines() -> list[Routine]:
    return [r for f in sorted(SQL_DIR.glob("*.sql")) for r in parse(f.read_text(), f.name)]


def test_parser_measures_and_reads_the_set_clause() -> None:
    body = "\n".join(f"    x := {i};" for i in range(246))
    text = (
        "-- a comment\n"
        "CREATE OR REPLACE FUNCTION pgjobs.big(a int)\nRETURNS void\nLANGUAGE plpgsql\n"
        "SET search_path = pg_catalog, pgjobs, pg_temp\nAS $$\n" + body + "\n$$;\n\n"
        "CREATE FUNCTION pgjobs.small() RETURNS int LANGUAGE sql AS $f$ SELECT 1 $f$;\n"
    )
    big, small = parse(text, "t.sql")
    assert (big.name, big.line, big.lines, big.search_path) == ("pgjobs.big", 2, 252, SEARCH_PATH)
    assert (small.name, small.line, small.lines, small.search_path) == ("pgjobs.small", 255, 1, None)
    assert (big.language, small.language) == ("plpgsql", "sql")


def test_no_function_over_250_lines() -> None:
    long = sorted(((r.lines, r.where()) for r in routines() if r.lines > MAX_LINES), reverse=True)
    assert not long, "functions over 250 lines: " + ", ".join(f"{w} ({n} lines)" for n, w in long)


def test_every_function_pins_search_path() -> None:
    loose = [
        f"{r.where()} ({r.search_path or 'no SET search_path'})" for r in routines() if r.search_path != SEARCH_PATH
    ]
    assert not loose, loose


# The files of the claim path: claim() and everything it calls for a plain or a controlled queue.
CLAIM_PATH_FILES = ("claim.sql", "fair.sql", "caps.sql", "due.sql")


def test_claim_path_routines_are_plpgsql() -> None:
    """No LANGUAGE sql routine on the claim path. A SQL function with a SET clause (every routine here pins its
    search_path) is never inlined, and before PostgreSQL 18 its body is parsed, analysed and planned again at
    every call, where a PL/pgSQL function keeps its plans for the session (perf on a worker's claim backend
    once put 18 % of its CPU in parsing and planning such helpers)."""
    sql = [r.where() for r in routines() if r.file in CLAIM_PATH_FILES and r.language != "plpgsql"]
    assert not sql, sql


def test_the_parser_finds_every_installed_routine(conn: Conn) -> None:
    """What the parser reads is what the installation creates: same names, and every installed routine
    carries the pinned search_path (read from the catalog, not from the text)."""
    installed = conn.execute(
        "SELECT p.oid::regproc::text, coalesce(array_to_string(p.proconfig, '|'), '')"
        " FROM pg_proc AS p WHERE p.pronamespace = 'pgjobs'::regnamespace"
    ).fetchall()
    names = {n if n.startswith("pgjobs.") else f"pgjobs.{n}" for n, _ in installed}
    assert names == {r.name for r in routines()}
    unpinned = [n for n, cfg in installed if f"search_path={SEARCH_PATH}" not in cfg.split("|")]
    assert not unpinned, unpinned

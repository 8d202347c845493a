"""The SQL API reference is generated: every public function carries a comment (what it does, its errors, the
roles that may call it), the comments say the truth about the grants, and docs/sql-api.md is exactly what
the migrated schema renders."""

from __future__ import annotations

import re
import shutil
import subprocess

import psycopg
import pytest

from pgjobs.ops import migrate as m
from pgjobs.ops import sqldoc

COMMENTS = m.SQL_DIR / m.COMMENTS_FILE


def _functions(dsn: str) -> list[sqldoc.Function]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return sqldoc.public_functions(conn)


def test_every_public_function_has_a_comment(dsn: str) -> None:
    functions = _functions(dsn)
    assert len(functions) >= 60
    missing = [f for f in functions if not f.comment]
    assert not missing, (
        f"public functions without a comment; add to {COMMENTS.relative_to(m.ROOT)}, then run "
        f"{sqldoc.REGENERATE}:\n\n"
        + "\n\n".join(
            f"COMMENT ON FUNCTION pgjobs.{f.name} IS $$<what it does>\nErrors: <PJ00n when ...; or none>.\n"
            f"{f.roles_line}$$;"
            for f in missing
        )
    )


def test_each_comment_ends_with_its_errors_and_its_actual_roles(dsn: str) -> None:
    wrong = []
    for f in _functions(dsn):
        if not f.comment:
            continue  # reported by the test above
        lines = f.comment.splitlines()
        if len(lines) < 3 or not lines[-2].startswith("Errors: ") or lines[-1] != f.roles_line:
            wrong.append(f"{f.name}: must end with an 'Errors: ...' line and {f.roles_line!r} (sql/roles.sql)")
    assert not wrong, "\n".join(wrong)


def test_the_comments_file_names_only_functions_that_exist(dsn: str) -> None:
    named = re.findall(r"^COMMENT ON FUNCTION pgjobs\.(\w+) IS", COMMENTS.read_text(), flags=re.MULTILINE)
    existing = {f.name for f in _functions(dsn)}
    assert len(named) == len(set(named)), "a function is commented twice"
    assert set(named) <= existing, f"comments for functions that do not exist: {sorted(set(named) - existing)}"


def test_the_comments_run_after_every_function_file_and_before_the_grants() -> None:
    names = [f.name for f in m.sql_files()]
    assert names[-2:] == [m.COMMENTS_FILE, m.ROLES_FILE]


def test_docs_sql_api_md_is_what_the_migrated_schema_renders(dsn: str) -> None:
    expected = sqldoc.render_from(dsn)
    current = sqldoc.DOC.read_text() if sqldoc.DOC.exists() else ""
    assert current == expected, f"docs/sql-api.md is out of date: run {sqldoc.REGENERATE}"


def test_render_marks_a_function_without_a_comment_instead_of_failing() -> None:
    bare = sqldoc.Function("signal", "key text, payload jsonb DEFAULT '{}'::jsonb", "integer", None, ())
    text = sqldoc.render([bare])
    assert "### `signal`" in text and "add one to `sql/api_comments.sql`" in text
    assert "## Not granted to any pgjobs role" in text


def test_psql_describes_a_function_with_the_same_text(dsn: str) -> None:
    if shutil.which("psql") is None:
        pytest.skip("psql is not installed (Debian package postgresql-client)")
    enqueue = next(f for f in _functions(dsn) if f.name == "enqueue")
    out = subprocess.run(
        ["psql", dsn, "-X", "-A", "-c", r"\df+ pgjobs.enqueue"], capture_output=True, text=True, timeout=60
    ).stdout
    assert enqueue.comment is not None and enqueue.comment.splitlines()[0] in out

"""sql/schema.sql is generated: it is exactly what a migrated database renders, it shows whatever the
migrations create (a table a new change adds appears without touching the renderer), and the migrator never
installs it."""

from __future__ import annotations

import psycopg

from pgjobs.ops import migrate as m
from pgjobs.ops import schemadoc


def test_sql_schema_sql_is_what_the_migrated_database_renders(dsn: str) -> None:
    expected = schemadoc.render_from(dsn)
    current = schemadoc.SCHEMA_SQL.read_text() if schemadoc.SCHEMA_SQL.exists() else ""
    assert current == expected, f"sql/schema.sql is out of date: run {schemadoc.REGENERATE}"


def test_a_table_a_new_change_adds_is_rendered_with_its_columns_constraints_and_indexes(blank_dsn: str) -> None:
    m.migrate(blank_dsn)
    before = schemadoc.render_from(blank_dsn)
    assert "CREATE TABLE pgjobs.jobs (" in before and "pgjobs.steps" not in before
    with psycopg.connect(blank_dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE pgjobs.steps (job_id bigint NOT NULL, name text NOT NULL, output jsonb DEFAULT '{}',"
            " PRIMARY KEY (job_id, name), CHECK (name <> '')) WITH (fillfactor = 70)"
        )
        conn.execute("CREATE INDEX steps_name_idx ON pgjobs.steps (name) WHERE output IS NOT NULL")
        conn.execute("CREATE SEQUENCE pgjobs.steps_epoch AS bigint")
    after = schemadoc.render_from(blank_dsn)
    table = after[after.index("CREATE TABLE pgjobs.steps (") :].split("\n\n")[0]
    assert table.splitlines() == [
        "CREATE TABLE pgjobs.steps (",
        "    job_id bigint NOT NULL,",
        "    name   text NOT NULL,",
        "    output jsonb DEFAULT '{}'::jsonb,",
        "    CONSTRAINT steps_pkey PRIMARY KEY (job_id, name),",
        "    CONSTRAINT steps_name_check CHECK ((name <> ''::text))",
        ") WITH (fillfactor=70);",
        "CREATE INDEX steps_name_idx ON pgjobs.steps USING btree (name) WHERE (output IS NOT NULL);",
    ]
    assert "CREATE SEQUENCE pgjobs.steps_epoch AS bigint;" in after
    # the rest is unchanged: the new table sits in name order between the others
    assert after.replace(table + "\n\n", "").replace("CREATE SEQUENCE pgjobs.steps_epoch AS bigint;\n", "") == before


def test_the_history_slices_made_at_run_time_are_not_listed(dsn: str) -> None:
    """The time slices of the history trees are named by their start: listed, the file would change daily."""
    text = schemadoc.render_from(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        slices = [r[0] for r in conn.execute("SELECT name FROM pgjobs.history_partitions").fetchall()]
    assert slices and not [s for s in slices if s in text]
    assert "CREATE TABLE pgjobs.jobs_succeeded_default PARTITION OF pgjobs.jobs_succeeded DEFAULT" in text


def test_the_migrator_never_installs_the_schema_file() -> None:
    assert schemadoc.SCHEMA_SQL.exists()
    assert schemadoc.SCHEMA_SQL not in m.sql_files()

"""What the migrator checks before it runs anything: that no other role planted code it would run.

The migrator usually runs as a superuser or as the owner of the schema, so any object it touches that
another role controls is a way to run code with its privileges. Two such ways existed:

* yoyo-migrations kept its bookkeeping tables in ``public``: a role that pre-created ``public.yoyo_lock``
  with a trigger had its trigger run by the migrating role.
* a role that created ``public.=`` / ``public.<>`` operators for ``pgjobs.job_state`` before an upgrade got
  them bound into the new CHECK constraints and index predicates (an exact-type operator beats
  ``pg_catalog``'s ``anyenum`` one wherever it sits on the search path), so its code ran on every write.

So the bookkeeping lives in :data:`BOOKKEEPING_SCHEMA`, created and owned by the migrator; every migrator
connection runs with a search path of schemas only the migrator owns; the migration scripts qualify their
enum comparisons (``OPERATOR(pg_catalog.=)``); and :func:`problems` lists, and the migrator refuses on:

* ``pgjobs`` or ``pgjobs_migrations`` owned by another role, another role allowed to create in them, or an
  object in them owned by another role;
* a relation in ``public`` named like yoyo's (``yoyo_*``, ``_yoyo_*``) that is owned by another role, is not a
  plain table or index, or carries a trigger, a rule or a row-level security policy (the previous layout's
  tables, created by the migrating role itself, are carried over: see :func:`carry_over_legacy_history`);
* an operator outside ``pgjobs`` on a ``pgjobs`` type (or an array of one) owned by another role.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql as pgsql

BOOKKEEPING_SCHEMA = "pgjobs_migrations"
SEARCH_PATH = "pg_catalog, pgjobs"
LEGACY_TABLES = ("_yoyo_migration", "_yoyo_log", "_yoyo_version", "yoyo_lock")


class MigrationRefused(RuntimeError):
    """The database holds objects another role planted where the migrator would run them."""

    def __init__(self, found: list[str]) -> None:
        self.problems = found
        super().__init__(
            "pgjobs migrate refuses to run: " + "; ".join(found) + ". Remove these objects (or make the migrating "
            "role their owner after checking them) and run it again."
        )


_PROBLEMS_SQL = """
WITH ours(nspname) AS (VALUES ('pgjobs'), ('pgjobs_migrations')),
me AS (SELECT oid FROM pg_catalog.pg_roles WHERE rolname OPERATOR(pg_catalog.=) current_user),
owned(kind, name, owner) AS (
    SELECT 'relation', c.oid::pg_catalog.regclass::text, c.relowner
      FROM pg_catalog.pg_class AS c JOIN pg_catalog.pg_namespace AS n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
     WHERE n.nspname IN (SELECT nspname FROM ours)
    UNION ALL
    SELECT 'routine', p.oid::pg_catalog.regprocedure::text, p.proowner
      FROM pg_catalog.pg_proc AS p JOIN pg_catalog.pg_namespace AS n ON n.oid OPERATOR(pg_catalog.=) p.pronamespace
     WHERE n.nspname IN (SELECT nspname FROM ours)
    UNION ALL
    SELECT 'type', t.oid::pg_catalog.regtype::text, t.typowner
      FROM pg_catalog.pg_type AS t JOIN pg_catalog.pg_namespace AS n ON n.oid OPERATOR(pg_catalog.=) t.typnamespace
     WHERE n.nspname IN (SELECT nspname FROM ours)
    UNION ALL
    SELECT 'operator', o.oid::pg_catalog.regoperator::text, o.oprowner
      FROM pg_catalog.pg_operator AS o JOIN pg_catalog.pg_namespace AS n ON n.oid OPERATOR(pg_catalog.=) o.oprnamespace
     WHERE n.nspname IN (SELECT nspname FROM ours)
),
pgjobs_types AS (
    SELECT t.oid FROM pg_catalog.pg_type AS t
     WHERE t.typnamespace OPERATOR(pg_catalog.=) (SELECT oid FROM pg_catalog.pg_namespace
                                                   WHERE nspname OPERATOR(pg_catalog.=) 'pgjobs')
),
legacy AS (
    SELECT c.oid, c.relname, c.relkind, c.relowner, c.relrowsecurity
      FROM pg_catalog.pg_class AS c
     WHERE c.relnamespace OPERATOR(pg_catalog.=) 'public'::pg_catalog.regnamespace
       AND (c.relname::text LIKE 'yoyo\\_%' OR c.relname::text LIKE '\\_yoyo\\_%')
)
SELECT pg_catalog.format('schema %I is owned by %s, not by the migrating role %I',
                         n.nspname, n.nspowner::pg_catalog.regrole, current_user)
  FROM pg_catalog.pg_namespace AS n
 WHERE n.nspname IN (SELECT nspname FROM ours) AND n.nspowner OPERATOR(pg_catalog.<>) (SELECT oid FROM me)
UNION ALL
SELECT pg_catalog.format('%s may create objects in schema %I',
                         CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                              ELSE a.grantee::pg_catalog.regrole::text END, n.nspname)
  FROM pg_catalog.pg_namespace AS n, pg_catalog.aclexplode(n.nspacl) AS a
 WHERE n.nspname IN (SELECT nspname FROM ours) AND a.privilege_type OPERATOR(pg_catalog.=) 'CREATE'
   AND a.grantee OPERATOR(pg_catalog.<>) n.nspowner
UNION ALL
SELECT pg_catalog.format('%s %s is owned by %s', o.kind, o.name, o.owner::pg_catalog.regrole)
  FROM owned AS o WHERE o.owner OPERATOR(pg_catalog.<>) (SELECT oid FROM me)
UNION ALL
SELECT pg_catalog.format('public.%I (yoyo''s name) is owned by %s', l.relname, l.relowner::pg_catalog.regrole)
  FROM legacy AS l WHERE l.relowner OPERATOR(pg_catalog.<>) (SELECT oid FROM me)
UNION ALL
SELECT pg_catalog.format('public.%I (yoyo''s name) is not a plain table', l.relname)
  FROM legacy AS l WHERE l.relkind NOT IN ('r', 'i')
UNION ALL
SELECT pg_catalog.format('public.%I has a trigger %I', l.relname, g.tgname)
  FROM legacy AS l JOIN pg_catalog.pg_trigger AS g ON g.tgrelid OPERATOR(pg_catalog.=) l.oid
 WHERE NOT g.tgisinternal
UNION ALL
SELECT pg_catalog.format('public.%I has a rule %I', l.relname, r.rulename)
  FROM legacy AS l JOIN pg_catalog.pg_rewrite AS r ON r.ev_class OPERATOR(pg_catalog.=) l.oid
UNION ALL
SELECT pg_catalog.format('public.%I has row-level security', l.relname)
  FROM legacy AS l WHERE l.relrowsecurity
UNION ALL
SELECT pg_catalog.format('operator %s on a pgjobs type is owned by %s', o.oid::pg_catalog.regoperator,
                         o.oprowner::pg_catalog.regrole)
  FROM pg_catalog.pg_operator AS o
  LEFT JOIN pg_catalog.pg_type AS lt ON lt.oid OPERATOR(pg_catalog.=) o.oprleft
  LEFT JOIN pg_catalog.pg_type AS rt ON rt.oid OPERATOR(pg_catalog.=) o.oprright
 WHERE o.oprnamespace OPERATOR(pg_catalog.<>) (SELECT oid FROM pg_catalog.pg_namespace
                                               WHERE nspname OPERATOR(pg_catalog.=) 'pgjobs')
   AND o.oprowner OPERATOR(pg_catalog.<>) (SELECT oid FROM me)
   AND (lt.oid IN (SELECT oid FROM pgjobs_types) OR lt.typelem IN (SELECT oid FROM pgjobs_types)
        OR rt.oid IN (SELECT oid FROM pgjobs_types) OR rt.typelem IN (SELECT oid FROM pgjobs_types))
ORDER BY 1
"""


def pin_search_path(conn: psycopg.Connection[Any]) -> None:
    """The session's search path: ``pg_catalog`` first, then only schemas the migrator owns."""
    conn.execute("SELECT pg_catalog.set_config('search_path', %s, false)", (SEARCH_PATH,))


def problems(conn: psycopg.Connection[Any]) -> list[str]:
    """Every planted object the migrator refuses to run beside (empty: all clear)."""
    return [str(r[0]) for r in conn.execute(_PROBLEMS_SQL).fetchall()]


def _lock_legacy(conn: psycopg.Connection[Any]) -> list[str]:
    """Locks the previous layout's tables the migrating role owns (a trigger cannot be added while the
    lock is held, so the checks that follow stay true until commit); returns their names."""
    names = [
        str(r[0])
        for r in conn.execute(
            "SELECT c.relname::text FROM pg_catalog.pg_class AS c"
            " WHERE c.relnamespace OPERATOR(pg_catalog.=) 'public'::pg_catalog.regnamespace"
            " AND c.relname::text OPERATOR(pg_catalog.=) ANY (%s) AND c.relkind OPERATOR(pg_catalog.=) 'r'"
            " AND c.relowner OPERATOR(pg_catalog.=)"
            " (SELECT oid FROM pg_catalog.pg_roles WHERE rolname OPERATOR(pg_catalog.=) current_user)"
            " ORDER BY 1",
            (list(LEGACY_TABLES),),
        ).fetchall()
    ]
    for name in names:
        conn.execute(pgsql.SQL("LOCK TABLE public.{} IN ACCESS EXCLUSIVE MODE").format(pgsql.Identifier(name)))
    return names


def prepare(conn: psycopg.Connection[Any]) -> None:
    """Creates the bookkeeping schema if missing and refuses (:class:`MigrationRefused`) on any problem.

    One transaction: the schema is created before the checks, so a schema of that name created by
    another role in between is caught rather than used."""
    with conn.transaction():
        conn.execute("CREATE SCHEMA IF NOT EXISTS pgjobs_migrations")
        _lock_legacy(conn)
        found = problems(conn)
        if found:
            raise MigrationRefused(found)
        conn.execute("REVOKE ALL ON SCHEMA pgjobs_migrations FROM PUBLIC")


def carry_over_legacy_history(conn: psycopg.Connection[Any], change_names: list[str]) -> int:
    """Moves pgjobs' rows of the previous layout's ``public._yoyo_migration`` / ``public._yoyo_log`` into the
    bookkeeping schema (yoyo has created its tables there by now). Only rows of pgjobs' own changes move:
    the public tables may also hold another yoyo project's history, which stays. Returns how many changes
    moved (0 once done)."""
    with conn.transaction():
        legacy = _lock_legacy(conn)
        if "_yoyo_migration" not in legacy:
            return 0
        found = problems(conn)
        if found:
            raise MigrationRefused(found)
        moved = conn.execute(
            "INSERT INTO pgjobs_migrations._yoyo_migration (migration_hash, migration_id, applied_at_utc)"
            " SELECT l.migration_hash, l.migration_id, l.applied_at_utc FROM public._yoyo_migration AS l"
            " WHERE l.migration_id OPERATOR(pg_catalog.=) ANY (%s) ON CONFLICT DO NOTHING",
            (change_names,),
        ).rowcount
        if "_yoyo_log" in legacy:
            conn.execute(
                "INSERT INTO pgjobs_migrations._yoyo_log SELECT l.* FROM public._yoyo_log AS l"
                " WHERE l.migration_id OPERATOR(pg_catalog.=) ANY (%s) ON CONFLICT DO NOTHING",
                (change_names,),
            )
            conn.execute(
                "DELETE FROM public._yoyo_log WHERE migration_id OPERATOR(pg_catalog.=) ANY (%s)", (change_names,)
            )
        conn.execute(
            "DELETE FROM public._yoyo_migration WHERE migration_id OPERATOR(pg_catalog.=) ANY (%s)", (change_names,)
        )
    return moved

"""The migrator nobody can hijack: bookkeeping in pgjobs_migrations, planted objects refused.

Each attack is planted by a real non-superuser LOGIN role (created here with a unique name, dropped after);
its code, if it ever ran, would write the role it ran as into ``public.pwned``, which must stay empty.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from yoyo import get_backend

from pgjobs.ops import guard
from pgjobs.ops import migrate as m

PLAN = [c.name for c in m.plan()]
Conn = psycopg.Connection[Any]


@pytest.fixture
def attacker(blank_dsn: str, pg_server_dsn: str) -> Iterator[Callable[..., Conn]]:
    """``attacker(*groups)``: a connection to ``blank_dsn`` as a fresh LOGIN role that may create in
    ``public`` (as on databases created before PostgreSQL 15) and is a member of ``groups``."""
    name = f"pjt_{secrets.token_hex(4)}_attacker"
    opened: list[Conn] = []
    with psycopg.connect(blank_dsn, autocommit=True) as db:
        db.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
        db.execute(sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(sql.Identifier(name)))
        db.execute(sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(
            sql.Identifier(conninfo_to_dict(blank_dsn)["dbname"]), sql.Identifier(name)))  # fmt: skip
        db.execute("CREATE TABLE public.pwned (who text, what text)")
        db.execute("GRANT INSERT ON public.pwned TO PUBLIC")

    def connect(*groups: str) -> Conn:
        with psycopg.connect(pg_server_dsn, autocommit=True) as admin:
            for g in groups:
                admin.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(g), sql.Identifier(name)))
        conn = psycopg.connect(make_conninfo(blank_dsn, user=name), autocommit=True)
        opened.append(conn)
        return conn

    yield connect
    for c in opened:
        c.close()
    with psycopg.connect(blank_dsn, autocommit=True) as db:
        db.execute(sql.SQL("DROP OWNED BY {} CASCADE").format(sql.Identifier(name)))
    with psycopg.connect(pg_server_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def pwned(dsn: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [tuple(r) for r in conn.execute("SELECT who, what FROM public.pwned").fetchall()]


def _legacy_migrate(dsn: str, upto: int | None = None) -> None:
    """What the previous version did: yoyo with its tables in public (no schema parameter), then the
    functions."""
    uri = m.yoyo_uri(dsn).replace(f"schema={guard.BOOKKEEPING_SCHEMA}", "").replace("&&", "&")
    backend = get_backend(uri)
    try:
        migrations = m._yoyo_migrations()
        todo = backend.to_apply(migrations)
        backend.apply_migrations(todo if upto is None else todo[:upto])
    finally:
        backend.connection.close()
    if upto is None:  # (the functions need every change)
        with psycopg.connect(dsn, autocommit=True) as conn:
            m.install_functions(conn)


def test_bookkeeping_lives_in_its_own_schema_and_nothing_in_public(blank_dsn: str) -> None:
    m.migrate(blank_dsn)
    with psycopg.connect(blank_dsn, autocommit=True) as conn:
        where = conn.execute(
            "SELECT n.nspname::text, c.relname::text FROM pg_class AS c JOIN pg_namespace AS n"
            " ON n.oid = c.relnamespace WHERE c.relname LIKE '%yoyo%' AND c.relkind = 'r' ORDER BY 1, 2"
        ).fetchall()
        owner, others = conn.execute(
            "SELECT nspowner::regrole::text, (SELECT count(*) FROM aclexplode(nspacl) AS a"
            " WHERE a.grantee <> nspowner) FROM pg_namespace WHERE nspname = 'pgjobs_migrations'"
        ).fetchone() or (None, None)
    assert {s for s, _t in where} == {"pgjobs_migrations"}
    assert {t for _s, t in where} >= {"_yoyo_migration", "yoyo_lock"}
    assert owner == conninfo_to_dict(blank_dsn)["user"]
    assert others == 0  # no other role, PUBLIC included, has any privilege on it


def test_history_of_the_previous_layout_is_carried_over(blank_dsn: str) -> None:
    _legacy_migrate(blank_dsn, upto=2)  # an installation two changes old, its history in public
    with psycopg.connect(blank_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO public._yoyo_migration VALUES ('h-of-another-project', 'their_change', now())")
        jid = conn.execute("INSERT INTO pgjobs.jobs (kind) VALUES ('old') RETURNING id").fetchone()
    assert m.status(blank_dsn) == {n: n in PLAN[:2] for n in PLAN}  # read from public before the move
    result = m.migrate(blank_dsn)
    assert result.applied == PLAN[2:]  # the first two are not re-applied (that would fail: tables exist)
    assert m.status(blank_dsn) == dict.fromkeys(PLAN, True)
    assert m.verify(blank_dsn) == PLAN
    assert m.migrate(blank_dsn).applied == []
    with psycopg.connect(blank_dsn, autocommit=True) as conn:
        ours = {r[0] for r in conn.execute("SELECT migration_id FROM pgjobs_migrations._yoyo_migration")}
        left = {r[0] for r in conn.execute("SELECT migration_id FROM public._yoyo_migration")}
        assert conn.execute("SELECT id FROM pgjobs.jobs WHERE kind = 'old'").fetchone() == jid
    assert ours == set(PLAN) and left == {"their_change"}  # another yoyo project's history stays in public
    # and a full rollback no longer finds stale history to resurrect
    assert m.rollback(blank_dsn) == PLAN[::-1]
    assert m.migrate(blank_dsn).applied == PLAN


def test_a_planted_public_yoyo_lock_with_a_trigger_is_refused_and_never_runs(
    blank_dsn: str, attacker: Callable[..., Conn]
) -> None:
    evil = attacker()
    evil.execute("CREATE TABLE public.yoyo_lock (locked int DEFAULT 1 PRIMARY KEY, ctime timestamp, pid int NOT NULL)")
    evil.execute(
        "CREATE FUNCTION public.grab() RETURNS trigger LANGUAGE plpgsql AS"
        " $$ BEGIN INSERT INTO public.pwned VALUES (current_user, 'yoyo_lock trigger'); RETURN NEW; END $$"
    )
    evil.execute("CREATE TRIGGER grab BEFORE INSERT OR DELETE ON public.yoyo_lock FOR EACH ROW EXECUTE FUNCTION grab()")
    with pytest.raises(guard.MigrationRefused, match=r"public\.yoyo_lock .*owned by pjt_"):
        m.migrate(blank_dsn)
    with pytest.raises(guard.MigrationRefused):
        m.rollback(blank_dsn)
    assert pwned(blank_dsn) == []
    with psycopg.connect(blank_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT to_regnamespace('pgjobs')").fetchone() == (None,)  # nothing was migrated


def test_planted_job_state_operators_are_refused_and_never_bound(blank_dsn: str, attacker: Callable[..., Conn]) -> None:
    """Before an upgrade: the schema exists, later changes (CHECK constraints and index predicates on
    job_state) are pending, and a role plants exact-type ``=`` / ``<>`` for job_state in public."""
    m.migrate(blank_dsn)
    m.rollback(blank_dsn, to=PLAN[0])
    evil = attacker("pgjobs_producer")  # USAGE on schema pgjobs, as any application role has
    for op, name in (("=", "eq"), ("<>", "ne")):
        evil.execute(
            f"CREATE FUNCTION public.job_state_{name}(a pgjobs.job_state, b pgjobs.job_state) RETURNS boolean"
            " LANGUAGE plpgsql AS $$ BEGIN INSERT INTO public.pwned VALUES (current_user, 'operator');"
            f" RETURN a::text {op} b::text; END $$"
        )
        evil.execute(
            f"CREATE OPERATOR public.{op} (LEFTARG = pgjobs.job_state, RIGHTARG = pgjobs.job_state,"
            f" FUNCTION = public.job_state_{name})"
        )
    with pytest.raises(guard.MigrationRefused, match=r"operator public\.=\(job_state,job_state\)"):
        m.migrate(blank_dsn)
    assert pwned(blank_dsn) == []


def test_qualified_ddl_binds_pg_catalog_operators_even_past_the_check(
    blank_dsn: str, attacker: Callable[..., Conn], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Defence in depth: with the refusal switched off, the pending changes still bind pg_catalog's
    operators (search path and OPERATOR(pg_catalog.=)), so the planted ones never run on a write."""
    m.migrate(blank_dsn)
    m.rollback(blank_dsn, to=PLAN[0])
    evil = attacker("pgjobs_producer")
    evil.execute(
        "CREATE FUNCTION public.job_state_ne(a pgjobs.job_state, b pgjobs.job_state) RETURNS boolean"
        " LANGUAGE plpgsql AS $$ BEGIN INSERT INTO public.pwned VALUES (current_user, 'operator');"
        " RETURN a::text <> b::text; END $$"
    )
    evil.execute(
        "CREATE OPERATOR public.<> (LEFTARG = pgjobs.job_state, RIGHTARG = pgjobs.job_state,"
        " FUNCTION = public.job_state_ne)"
    )
    evil.execute(
        "CREATE FUNCTION public.job_state_eq(a pgjobs.job_state, b pgjobs.job_state) RETURNS boolean"
        " LANGUAGE plpgsql AS $$ BEGIN INSERT INTO public.pwned VALUES (current_user, 'operator');"
        " RETURN a::text = b::text; END $$"
    )
    evil.execute(
        "CREATE OPERATOR public.= (LEFTARG = pgjobs.job_state, RIGHTARG = pgjobs.job_state,"
        " FUNCTION = public.job_state_eq)"
    )
    monkeypatch.setattr(guard, "problems", lambda conn: [])
    assert m.migrate(blank_dsn).applied == PLAN[1:]
    with psycopg.connect(blank_dsn, autocommit=True) as conn:
        jid = conn.execute("SELECT id FROM pgjobs.enqueue(kind => 'k')").fetchone()
        row = conn.execute("SELECT id, lease_token FROM pgjobs.claim(worker => 'w')").fetchone()
        assert row is not None and (row[0],) == jid
        conn.execute("SELECT pgjobs.complete(id => %s, lease_token => %s)", row)
        bound = conn.execute(
            "SELECT count(*) FROM pg_depend AS d JOIN pg_operator AS o ON o.oid = d.refobjid"
            " WHERE d.refclassid = 'pg_operator'::regclass AND o.oprnamespace = 'public'::regnamespace"
        ).fetchone()
    assert bound == (0,)
    assert pwned(blank_dsn) == []


def test_a_bookkeeping_schema_created_by_another_role_is_refused(blank_dsn: str, attacker: Callable[..., Conn]) -> None:
    evil = attacker()
    evil.execute("CREATE SCHEMA pgjobs_migrations")
    evil.execute("CREATE TABLE pgjobs_migrations.yoyo_lock (locked int PRIMARY KEY, ctime timestamp, pid int)")
    with pytest.raises(guard.MigrationRefused, match="schema pgjobs_migrations is owned by pjt_"):
        m.migrate(blank_dsn)
    assert pwned(blank_dsn) == []


def test_another_role_allowed_to_create_in_pgjobs_is_refused(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("GRANT CREATE ON SCHEMA pgjobs TO pgjobs_admin")
    with pytest.raises(guard.MigrationRefused, match="pgjobs_admin may create objects in schema pgjobs"):
        m.migrate(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("REVOKE CREATE ON SCHEMA pgjobs FROM pgjobs_admin")
    assert m.migrate(dsn).applied == []

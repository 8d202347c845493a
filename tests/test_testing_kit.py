"""``pgjobs.testing``: perform_job with a real context, assert/refute_enqueued, the notification recorder,
and the pytest plugin (off unless enabled with ``-p pgjobs.testing.plugin``)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest

import pgjobs
from pgjobs.records import JobState
from pgjobs.testing import aperform_job, assert_enqueued, notifications, perform_job, refute_enqueued

REPO = Path(__file__).resolve().parents[1]


def _app() -> pgjobs.App:
    app = pgjobs.App()

    @app.job("resize", queue="images", max_attempts=4)
    def resize(payload: dict[str, Any], ctx: pgjobs.SyncJobContext) -> dict[str, Any]:
        done = (ctx.checkpoint or {}).get("done", 0)
        for i in range(done, payload["frames"]):
            assert ctx.save_checkpoint({"done": i + 1})
            assert ctx.report_progress({"done": i + 1, "total": payload["frames"]})
        return {"frames": payload["frames"], "resumed_at": done, "queue": ctx.queue}

    @app.job("boom")
    async def boom(payload: dict[str, Any], ctx: pgjobs.JobContext) -> None:
        raise ValueError(f"boom {payload['n']}")

    @app.job("later")
    async def later(payload: dict[str, Any], ctx: pgjobs.JobContext) -> None:
        if payload.get("snooze"):
            raise pgjobs.Snooze(until=3600)
        raise pgjobs.Retry(after=60)

    return app


@pytest.mark.smoke
def test_perform_job_runs_the_handler_with_a_real_context(dsn: str, conn: psycopg.Connection[Any]) -> None:
    done = perform_job(_app(), "resize", {"frames": 3}, dsn=dsn)
    assert done.state == JobState.SUCCEEDED and done.exception is None
    assert done.result == {"frames": 3, "resumed_at": 0, "queue": "images"}  # the declared queue
    assert done.job.checkpoint == {"done": 3} and done.job.progress == {"done": 3, "total": 3}
    assert done.job.max_attempts == 4 and done.job.result == done.result
    resumed = perform_job(_app(), "resize", {"frames": 5}, dsn=dsn, checkpoint={"done": 4})
    assert resumed.result["resumed_at"] == 4


def test_failures_retries_and_snoozes_end_as_a_worker_ends_them(dsn: str) -> None:
    app = _app()
    failed = perform_job(app, "boom", {"n": 1}, dsn=dsn)
    assert failed.state == JobState.SCHEDULED and isinstance(failed.exception, ValueError)
    assert failed.job.last_error is not None and failed.job.last_error.endswith("ValueError: boom 1")
    with pytest.raises(ValueError, match="boom 1"):
        failed.raise_for_error()
    last = perform_job(app, "boom", {"n": 2}, dsn=dsn, max_attempts=1)
    assert last.state == JobState.FAILED
    retried = perform_job(app, "later", {}, dsn=dsn)
    assert retried.state == JobState.SCHEDULED and retried.job.attempt == 1
    snoozed = perform_job(app, "later", {"snooze": True}, dsn=dsn)
    assert snoozed.state == JobState.SCHEDULED and snoozed.job.attempt == 0  # the attempt was given back
    with pytest.raises(LookupError, match="no handler for kind 'nope'"):
        perform_job(app, "nope", dsn=dsn)


def test_perform_job_inside_the_callers_transaction_rolls_back_with_it(dsn: str) -> None:
    app = pgjobs.App()

    @app.job("batch.member")
    def member(payload: Any, ctx: pgjobs.SyncJobContext) -> None: ...

    with psycopg.connect(dsn) as tx:  # one transaction
        done = perform_job(app, "batch.member", {"x": 1}, conn=tx)
        assert done.state == JobState.SUCCEEDED
        tx.rollback()
    with pgjobs.Client(dsn) as client:
        assert client.job_status(done.id) is None  # gone with the transaction


def test_aperform_job_for_async_tests(dsn: str) -> None:
    async def main() -> pgjobs.testing.Performed:
        return await aperform_job(_app(), "resize", {"frames": 2}, dsn=dsn)

    done = anyio.run(main)
    assert done.state == JobState.SUCCEEDED and done.result["frames"] == 2


def test_assert_and_refute_enqueued(dsn: str) -> None:
    with psycopg.connect(dsn) as tx:
        client = pgjobs.Client(dsn, app=_app())
        try:
            client.enqueue("resize", {"frames": 3, "user": {"id": 7, "name": "ada"}}, conn=tx)
            client.enqueue("boom", {"n": 1}, conn=tx)
        finally:
            client.close()
        jobs = assert_enqueued(tx, "resize", queue="images", payload={"user": {"id": 7}})
        assert [j.payload["frames"] for j in jobs] == [3]
        assert_enqueued(tx, payload={"n": 1}, count=1)
        assert_enqueued(tx, count=2)
        refute_enqueued(tx, "resize", queue="default")
        refute_enqueued(tx, "resize", payload={"user": {"id": 8}})
        with pytest.raises(AssertionError, match=r"expected a job with kind='resize', queue='default'"):
            assert_enqueued(tx, "resize", queue="default")
        with pytest.raises(AssertionError, match=r"expected no job with kind='boom'"):
            refute_enqueued(tx, "boom")
        tx.rollback()
        refute_enqueued(tx)  # nothing was committed


def test_a_rolled_back_enqueue_notifies_nobody(dsn: str) -> None:
    # the documented pattern: NOTIFY is delivered on commit, so a rolled-back transaction is silent
    with notifications(dsn, "pgjobs_wake") as heard:
        with psycopg.connect(dsn) as tx:
            with pgjobs.Client(dsn) as client:
                client.enqueue("k", conn=tx)
            tx.rollback()
        assert heard.collect(0.3) == []
        with psycopg.connect(dsn) as tx:
            with pgjobs.Client(dsn) as client:
                client.enqueue("k", conn=tx)
            tx.commit()
        assert heard.collect(2.0) == [("pgjobs_wake", "default")]  # the recorder does hear a commit


def _run_pytest(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PGJOBS_DSN", "DATABASE_URL")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_the_pytest_plugin_gives_a_migrated_database_per_test(tmp_path: Path, pg_server_dsn: str) -> None:
    (tmp_path / "test_user_app.py").write_text(
        textwrap.dedent(
            """
            import pgjobs
            from pgjobs.testing import assert_enqueued, perform_job, refute_enqueued

            app = pgjobs.App()

            @app.job("send_email", queue="emails")
            def send_email(payload, ctx):
                return {"sent": payload["to"]}

            def signup(conn, client, email):  # the code under test
                conn.execute("CREATE TABLE IF NOT EXISTS users (email text)")
                conn.execute("INSERT INTO users VALUES (%s)", (email,))
                client.enqueue("send_email", {"to": email}, conn=conn)

            def test_signup_enqueues_a_welcome(pgjobs_conn, pgjobs_dsn):
                with pgjobs.Client(pgjobs_dsn, app=app) as client:
                    signup(pgjobs_conn, client, "ada@example.com")
                assert_enqueued(pgjobs_conn, "send_email", queue="emails", payload={"to": "ada@example.com"})

            def test_each_test_gets_its_own_database(pgjobs_client):
                assert pgjobs_client.list_jobs() == []
                pgjobs_client.enqueue("x")

            def test_and_again(pgjobs_client, pgjobs_conn):
                assert pgjobs_client.list_jobs() == []
                refute_enqueued(pgjobs_conn, "x")

            def test_perform(pgjobs_dsn):
                assert perform_job(app, "send_email", {"to": "bob"}, dsn=pgjobs_dsn).result == {"sent": "bob"}
            """
        )
    )
    enabled = _run_pytest(tmp_path, "-p", "pgjobs.testing.plugin", "--pgjobs-server", pg_server_dsn)
    assert enabled.returncode == 0, enabled.stdout + enabled.stderr
    assert "4 passed" in enabled.stdout
    off = _run_pytest(tmp_path)  # not enabled: the fixtures do not exist
    assert off.returncode != 0 and "fixture 'pgjobs_conn' not found" in off.stdout
    with psycopg.connect(pg_server_dsn, autocommit=True) as admin:
        left = admin.execute("SELECT count(*) FROM pg_database WHERE datname LIKE 'pgjobs_kit%%'").fetchone()
    assert left == (0,)  # template and per-test databases dropped


def test_the_manual_testing_examples_pass_with_the_plugin(tmp_path: Path, pg_server_dsn: str) -> None:
    import re

    text = (REPO / "docs" / "testing.md").read_text()
    section = text[text.index("## Testing your jobs") : text.index("## Testing pgjobs itself")]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    assert len(blocks) == 2
    for i, block in enumerate(blocks):
        (tmp_path / f"test_readme_{i}.py").write_text(block)
    proc = _run_pytest(tmp_path, "-p", "pgjobs.testing.plugin", "--pgjobs-server", pg_server_dsn)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 passed" in proc.stdout

"""Enqueue inside your own transaction: the job exists exactly when your data does.

PGJOBS_DSN=postgresql://localhost/app python examples/transactional_enqueue.py
"""

import os

import psycopg

import pgjobs

DSN = os.environ.get("PGJOBS_DSN", "postgresql://localhost/app")
app = pgjobs.App()


@app.job("welcome_email", queue="emails", max_attempts=5)
def welcome_email(payload: dict, ctx: pgjobs.SyncJobContext) -> None: ...


def sign_up(client: pgjobs.Client, email: str, fail: bool = False) -> None:
    with psycopg.connect(DSN) as conn:  # one transaction, committed when the block ends
        conn.execute("INSERT INTO users (email) VALUES (%s)", (email,))
        job = client.enqueue(
            "welcome_email", {"to": email, "subject": "Welcome"}, unique_key=f"welcome:{email}", conn=conn
        )
        print(f"{email}: job {job.id} created={job.created} in queue emails")
        if fail:
            raise RuntimeError("something after the enqueue failed")


with psycopg.connect(DSN, autocommit=True) as setup:
    setup.execute("CREATE TABLE IF NOT EXISTS users (email text PRIMARY KEY)")

with pgjobs.Client(DSN, app=app) as client:
    sign_up(client, "ada@example.com")  # committed: the user and the job exist together
    try:
        sign_up(client, "bob@example.com", fail=True)  # rolled back: neither exists, no worker was woken
    except RuntimeError as exc:
        print(f"bob@example.com: rolled back ({exc})")
    again = client.enqueue("welcome_email", {"to": "ada@example.com"}, unique_key="welcome:ada@example.com")
    print(f"second enqueue of the same unique key: job {again.id} created={again.created}")
    emails = [j.payload["to"] for j in client.list_jobs(kind="welcome_email")]
    print("jobs for:", emails)

"""What a handler raises decides the next run: Retry (spends the attempt), Snooze (gives it back), or any
other exception (a failed attempt, retried after the SQL backoff or the handler's own ``retry=`` policy).

    PGJOBS_DSN=postgresql://localhost/app python examples/retries_and_snoozes.py
"""

import os

import anyio

import pgjobs

DSN = os.environ.get("PGJOBS_DSN", "postgresql://localhost/app")
app = pgjobs.App()
calls = {"smtp": 0}


def smtp_is_busy() -> bool:
    calls["smtp"] += 1
    return calls["smtp"] == 1  # busy on the first try only


@app.job("reminder_email", max_attempts=3)
def email(payload: dict, ctx: pgjobs.SyncJobContext) -> str:
    if smtp_is_busy():
        raise pgjobs.Retry(after=0.2)  # run again in 0.2 s (spends the attempt)
    if not (ctx.checkpoint or {}).get("snoozed"):
        ctx.save_checkpoint({"snoozed": True})
        raise pgjobs.Snooze(until=0.2)  # give it back for 0.2 s, attempt refunded
    return f"sent on attempt {ctx.attempt}"


@app.job("flaky", max_attempts=2, retry=[0.1])  # a failed attempt runs again after 0.1 s
def flaky(payload: dict, ctx: pgjobs.SyncJobContext) -> None:
    raise ValueError(f"boom on attempt {ctx.attempt}")


async def main() -> None:
    worker = pgjobs.Worker(app, DSN, poll_interval=0.1)
    async with anyio.create_task_group() as tg, pgjobs.AsyncClient(DSN, app=app) as client:
        tg.start_soon(worker.run)
        a = await client.enqueue("reminder_email", {"to": "ada@example.com"})
        b = await client.enqueue("flaky")
        async for _ in client.subscribe(job_ids=[a.id, b.id]):
            pass
        for job_id in (a.id, b.id):
            job = await client.job_status(job_id)
            assert job is not None
            errors = [e["error"].splitlines()[-1] for e in job.errors]
            print(f"{job.kind}: {job.state.value} after {job.attempt} attempt(s), result {job.result}, errors {errors}")
        worker.stop()


if __name__ == "__main__":
    anyio.run(main)

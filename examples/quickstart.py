"""Quick start: declare handlers, enqueue with the handlers' defaults, run a worker.

    PGJOBS_DSN=postgresql://localhost/app python examples/quickstart.py

In production the worker is its own process: ``pgjobs worker --app quickstart:app`` (from this folder)
serves every queue the app declares. Here it runs in the same program, until the jobs are done.
"""

import os

import anyio

import pgjobs

DSN = os.environ.get("PGJOBS_DSN", "postgresql://localhost/app")
app = pgjobs.App()
outbox: list[str] = []  # stands in for your mail server


async def deliver(to: str, subject: str) -> None:
    await anyio.sleep(0.01)
    outbox.append(f"{subject} -> {to}")


@app.job("send_email", queue="emails", timeout=30, max_attempts=5)
async def send_email(payload: dict, ctx: pgjobs.JobContext) -> dict:
    await deliver(payload["to"], payload["subject"])
    return {"delivered": True}  # stored as the job's result


@app.job("render_frames")  # plain functions run in worker threads
def render_frames(payload: dict, ctx: pgjobs.SyncJobContext) -> None:
    done = (ctx.checkpoint or {}).get("done", 0)  # resume where the last attempt stopped
    for i in range(done, payload["frames"]):
        ctx.save_checkpoint({"done": i + 1})
        ctx.report_progress({"frame": i + 1, "of": payload["frames"]})


async def main() -> None:
    # the worker runs for the block (every queue the app declares) and stops gracefully at its end
    # (app=: the client enqueues with the handlers' declared queue, max_attempts ...)
    async with (
        pgjobs.Worker(app, DSN, queues=app.queues, poll_interval=0.5),
        pgjobs.AsyncClient(DSN, app=app) as client,
    ):
        email = await client.enqueue("send_email", {"to": "ada@example.com", "subject": "Welcome"})
        frames = await client.enqueue("render_frames", {"frames": 3})
        async for _ in client.subscribe(job_ids=[email.id, frames.id]):
            pass  # ends once both jobs are terminal
        for job_id in (email.id, frames.id):
            job = await client.job_status(job_id)
            assert job is not None
            print(f"{job.kind}: {job.state.value} in queue {job.queue}, attempt {job.attempt} of {job.max_attempts}")
    print("outbox:", outbox)


if __name__ == "__main__":
    anyio.run(main)

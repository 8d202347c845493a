"""Follow a job from another process: every transition and progress report, as it happens.

PGJOBS_DSN=postgresql://localhost/app python examples/status_stream.py
"""

import os

import anyio

import pgjobs

DSN = os.environ.get("PGJOBS_DSN", "postgresql://localhost/app")
app = pgjobs.App()


@app.job("import_rows", queue="imports")
async def import_rows(payload: dict, ctx: pgjobs.JobContext) -> dict:
    for done in range(1, payload["chunks"] + 1):
        await anyio.sleep(0.1)  # ... the real work ...
        await ctx.report_progress({"done": done, "total": payload["chunks"]})
    return {"imported": payload["chunks"] * 100}


async def main() -> None:
    worker = pgjobs.Worker(app, DSN, queues={"imports": 1}, poll_interval=0.5)
    async with anyio.create_task_group() as tg, pgjobs.AsyncClient(DSN, app=app) as client:
        job = await client.enqueue("import_rows", {"chunks": 3})
        tg.start_soon(worker.run)  # in real life: another process, another machine
        async for ev in client.subscribe(job_ids=[job.id]):
            print(ev.state.value, ev.progress if ev.progress is not None else "")
        # the loop ends by itself: every watched job is terminal
        done = await client.job_status(job.id)
        assert done is not None
        print("result:", done.result)
        worker.stop()


if __name__ == "__main__":
    anyio.run(main)

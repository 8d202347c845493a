"""A long job that saves a checkpoint after every chunk: when an attempt dies, the next one resumes.

PGJOBS_DSN=postgresql://localhost/app python examples/checkpoints.py
"""

import os

import anyio

import pgjobs

DSN = os.environ.get("PGJOBS_DSN", "postgresql://localhost/app")
app = pgjobs.App()
ran: list[tuple[int, int]] = []  # (attempt, chunk)


@app.job("chunked_report", max_attempts=3, retry=[0.1])
async def report(payload: dict, ctx: pgjobs.JobContext) -> dict:
    start = (ctx.checkpoint or {}).get("done", 0)  # saved by a previous attempt, if any
    for chunk in range(start, payload["chunks"]):
        if ctx.attempt == 1 and chunk == 3:
            raise ConnectionError("the database of the report went away")  # the first attempt dies here
        ran.append((ctx.attempt, chunk))
        await ctx.save_checkpoint({"done": chunk + 1})  # survives a crash or a retry
        ctx.raise_if_cancelled()  # someone called pgjobs cancel ID
    return {"chunks": payload["chunks"]}


async def main() -> None:
    worker = pgjobs.Worker(app, DSN, poll_interval=0.1)
    async with anyio.create_task_group() as tg, pgjobs.AsyncClient(DSN) as client:
        tg.start_soon(worker.run)
        job = await client.enqueue("chunked_report", {"chunks": 6})
        async for _ in client.subscribe(job_ids=[job.id]):
            pass
        worker.stop()
    for attempt in (1, 2):
        print(f"attempt {attempt} ran chunks", [c for a, c in ran if a == attempt])
    print("every chunk ran once:", sorted(c for _, c in ran) == list(range(6)))


if __name__ == "__main__":
    anyio.run(main)

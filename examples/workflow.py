"""Fan out 10 photo resizes, fan in to one zip that reads their results, page someone if anything failed.

PGJOBS_DSN=postgresql://localhost/app python examples/workflow.py
"""

import os

import anyio

import pgjobs

DSN = os.environ.get("PGJOBS_DSN", "postgresql://localhost/app")
app = pgjobs.App()


@app.job("resize_photo")
async def resize_photo(payload: dict, ctx: pgjobs.JobContext) -> dict:
    return {"thumb": f"thumbs/{payload['image']}"}


@app.job("zip_album", parent_results=True)  # ctx.parent_results: {parent job id: its result}
async def zip_album(payload: dict, ctx: pgjobs.JobContext) -> dict:
    assert ctx.parent_results is not None
    files = sorted(r["thumb"] for r in ctx.parent_results.values())
    return {"zip": payload["name"], "files": files}


@app.job("alert_owner")
async def alert_owner(payload: dict, ctx: pgjobs.JobContext) -> None:
    print("paging someone about", payload["album"])


def submit() -> tuple[int, int]:
    with pgjobs.Client(DSN) as client:
        with client.batch() as b:  # one enqueue_many, one transaction
            resized = [b.enqueue("resize_photo", {"image": f"{i}.png"}) for i in range(10)]
            zipped = b.enqueue("zip_album", {"name": "album.zip"}, after=resized)
            b.then("alert_owner", {"album": "album.zip"}, on="failure")  # after the batch settles, if it failed
        assert b.batch_id is not None and zipped.id is not None
        return b.batch_id, zipped.id


async def main() -> None:
    batch_id, zip_id = submit()
    worker = pgjobs.Worker(app, DSN, queues={"default": 8}, poll_interval=0.5)
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        async with pgjobs.AsyncClient(DSN) as client:
            async for _event in client.subscribe(batch_id=batch_id):
                status = await client.batch_status(batch_id)
                if status is not None and status.state.value != "executing":
                    break  # the batch settled
            job = await client.job_status(zip_id)
            assert job is not None and status is not None
            print(f"zip: {job.state.value}, {len(job.result['files'])} files, first {job.result['files'][0]}")
            print(f"batch {status.state.value}: {status.succeeded} of {status.total} succeeded")
        worker.stop()


if __name__ == "__main__":
    anyio.run(main)

"""A fair queue: every tenant (group_key) gets its turn, whatever one tenant has queued.

PGJOBS_DSN=postgresql://localhost/app python examples/fair_queues.py
"""

import os

import anyio

import pgjobs

DSN = os.environ.get("PGJOBS_DSN", "postgresql://localhost/app")
app = pgjobs.App()
served: list[str] = []


@app.job("tenant_report", queue="reports")
async def render(payload: dict, ctx: pgjobs.JobContext) -> None:
    served.append(payload["tenant"])


def enqueue() -> None:
    with pgjobs.Client(DSN, app=app) as client:
        client.configure_queue("reports", fair=True, max_active_per_group=5, max_active=50)
        jobs = [{"kind": "tenant_report", "group_key": "A", "payload": {"tenant": "A"}} for _ in range(30)]
        jobs += [{"kind": "tenant_report", "group_key": t, "payload": {"tenant": t}} for t in "BCD" for _ in range(2)]
        client.enqueue_many(jobs)  # tenant A queued 30 jobs first, B, C and D two each


async def main() -> None:
    enqueue()
    worker = pgjobs.Worker(app, DSN, queues={"reports": 1}, poll_interval=0.5)  # one job at a time
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        while len(served) < 36:
            await anyio.sleep(0.05)
        worker.stop()
    print("first four served:", "".join(served[:4]))
    last_small = max(i for i, t in enumerate(served) if t != "A")
    print(f"B, C and D were done after {last_small + 1} of {len(served)} jobs")


if __name__ == "__main__":
    anyio.run(main)

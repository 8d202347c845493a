"""Recurring jobs: one declared in code, one added at run time. Six-field crons put seconds first.

PGJOBS_DSN=postgresql://localhost/app python examples/schedules.py
"""

import os

import anyio

import pgjobs

DSN = os.environ.get("PGJOBS_DSN", "postgresql://localhost/app")
app = pgjobs.App()
runs: list[str] = []


@app.periodic(cron="* * * * * *", timezone="Europe/Paris", name="heartbeat")  # every second
async def heartbeat(payload: dict, ctx: pgjobs.JobContext) -> None:
    runs.append(ctx.meta["scheduled_for"])


@app.job("send_ops_report")
async def send_report(payload: dict, ctx: pgjobs.JobContext) -> None: ...


async def main() -> None:
    with pgjobs.Client(DSN) as client:  # dynamic schedules, at run time
        client.add_schedule("nightly-report", "send_ops_report", "0 3 * * *", timezone="America/New_York",
                            payload={"to": "ops"}, missed="skip")  # fmt: skip
        client.pause_schedule("nightly-report")
        client.resume_schedule("nightly-report")  # restarts at the next future run
        print("nightly-report next runs at", client.get_schedule("nightly-report").next_run_at.isoformat())  # type: ignore[union-attr]
    worker = pgjobs.Worker(app, DSN, poll_interval=0.2)  # its scheduler syncs and runs "heartbeat"
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        with anyio.fail_after(20):
            while len(runs) < 3:
                await anyio.sleep(0.05)
        worker.stop()
    print(f"heartbeat ran {len(runs)} times, one second apart:", len(set(runs)) == len(runs))
    with pgjobs.Client(DSN) as client:
        client.remove_schedule("nightly-report")
        print("schedules:", sorted(s.name for s in client.list_schedules()))


if __name__ == "__main__":
    anyio.run(main)

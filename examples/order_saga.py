"""An order saga with durable execution: charge the card (a step: it runs once, whatever happens after), wait
for the warehouse's shipping signal (sent here from psql, as any program in any language could), sleep, then
send the mail (a step). While it waits or sleeps the job holds no worker slot and no lease.

    PGJOBS_DSN=postgresql://localhost/app python examples/order_saga.py
"""

import os
import shutil
import subprocess

import anyio

import pgjobs

DSN = os.environ.get("PGJOBS_DSN", "postgresql://localhost/app")
app = pgjobs.App()
charges: list[str] = []  # what the payment provider saw


def charge_card(order: int, cents: int) -> dict:
    charges.append(f"order {order}: {cents} cents")
    return {"tx": f"tx-{order}", "cents": cents}


async def send_mail(to: str, text: str) -> str:
    return f"mail to {to}: {text}"


@app.job("order")
async def order(payload: dict, ctx: pgjobs.JobContext) -> dict:
    charged = await ctx.step("charge", charge_card, payload["order"], payload["cents"])
    shipped = await ctx.wait_for(f"shipped:{payload['order']}", timeout=60)  # parks the job: no slot held
    if shipped.timed_out:
        return {"charged": charged, "shipped": False}
    await ctx.sleep(0.2)  # a day in real life: the job resumes in a new claim
    mail = await ctx.step("mail", send_mail, payload["email"], f"shipped with {shipped.payload['carrier']}")
    return {"charged": charged, "shipped": shipped.payload, "mail": mail}


def ship_from_psql(key: str) -> str:
    """The warehouse's side: one SQL call, here through psql."""
    query = f"""SELECT pgjobs.signal('{key}', '{{"carrier": "DHL"}}')"""
    if shutil.which("psql") is None:  # no psql here: the same call through the Python client
        with pgjobs.Client(DSN) as client:
            return str(client.signal(key, {"carrier": "DHL"}))
    out = subprocess.run(["psql", DSN, "-X", "-q", "-t", "-A", "-c", query], capture_output=True, text=True, check=True)
    return out.stdout.strip()


async def main() -> None:
    worker = pgjobs.Worker(app, DSN, poll_interval=0.1)
    async with anyio.create_task_group() as tg, pgjobs.AsyncClient(DSN, app=app) as client:
        tg.start_soon(worker.run)
        job = await client.enqueue("order", {"order": 42, "cents": 1999, "email": "ada@example.com"})
        signalled = False
        async for event in client.subscribe(job_ids=[job.id]):
            # the park: 'scheduled' at its timeout ('waiting' had it none); a busy machine may deliver the
            # earlier events after the job parked, so the state comes from the event, not from the moment
            parking = not signalled and event.state.value in ("scheduled", "waiting")
            parked = await client.durable_status(job.id) if parking else None
            if parked and parked["waiting_for"]:
                print(f"order 42 parked ({event.state.value}), waiting for {parked['waiting_for']['key']}")
                woke = await anyio.to_thread.run_sync(ship_from_psql, "shipped:42")
                print(f"psql: signal woke {woke} job(s)")
                signalled = True
        done = await client.job_status(job.id)
        recorded = await client.durable_status(job.id)
        assert done is not None and recorded is not None
        print(f"order 42: {done.state.value}, {done.result['mail']}")
        print(f"steps done: {[s['name'] for s in recorded['steps']]}, the card charged {len(charges)} time(s)")
        worker.stop()


if __name__ == "__main__":
    anyio.run(main)

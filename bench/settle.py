"""Waiting for the event pipeline and PostgreSQL's autovacuum to be idle between workloads.

Every write leaves an outbox row that the relay publishes to JetStream and the webhook
deliverer (and workflow runner) consume. Seeding 130k records leaves minutes of that work
behind; measuring the next workload while it runs would charge it to the wrong number. So do the
autovacuum workers that a write-heavy workload starts (the sustained webhook run's 20,000
deliveries, events and attempts): the relay row measured after it read 3,401 events/s with
PostgreSQL at 222 us per event, against 10,195 events/s on the same stack once idle.
"""

from __future__ import annotations

import asyncio
import time

import asyncpg
import nats
import nats.js.errors

from bench.benchlib import BenchContext
from crmkit.messaging import RECORD_EVENTS_STREAM

_VACUUMING = "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'"


async def _backlog(ctx: BenchContext) -> tuple[int, int, int]:
    """Events not yet published by the outbox relay, not yet taken by JetStream consumers, and
    autovacuum workers running."""
    connection = await asyncpg.connect(ctx.database_url)
    try:
        unpublished = await connection.fetchval(
            "SELECT count(*) FROM records.outbox WHERE published_at IS NULL"
        )
        vacuuming = await connection.fetchval(_VACUUMING)
    finally:
        await connection.close()
    client = await nats.connect(ctx.nats_url)
    try:
        consumers = await client.jetstream().consumers_info(RECORD_EVENTS_STREAM)
        pending = sum((c.num_pending or 0) + (c.num_ack_pending or 0) for c in consumers)
    except nats.js.errors.NotFoundError:
        pending = 0
    finally:
        await client.close()
    return int(unpublished), pending, int(vacuuming)


async def settle(ctx: BenchContext, timeout: float) -> None:
    """Waits until the events of earlier writes are published and consumed and no autovacuum
    runs (the relay, the deliverers and the vacuum would otherwise compete with the next
    workload for the CPU)."""
    started = time.monotonic()
    reported = started
    while True:
        unpublished, pending, vacuuming = await _backlog(ctx)
        now = time.monotonic()
        if not unpublished and not pending and not vacuuming:
            if now - started > 1:
                print(f"   event backlog drained in {now - started:.0f} s", flush=True)
            return
        if now - started > timeout:
            print(
                f"   still {unpublished} unpublished / {pending} unconsumed events, "
                f"{vacuuming} autovacuum workers: going on"
            )
            return
        if now - reported > 5:
            reported = now
            print(
                f"   waiting for the event backlog: {unpublished} unpublished, {pending} "
                f"not yet consumed; {vacuuming} autovacuum workers",
                flush=True,
            )
        await asyncio.sleep(0.5)

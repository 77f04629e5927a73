"""What a record event costs the consumers: CPU per event with no listener and with one webhook.

The same backlog of person events (half created, half updated) is written straight into the
stack's outbox twice: once for a workspace with no webhook, no workflow and no subscriber, once
for a workspace with one webhook on `person.*` (delivered to `bench/webhook_sink.py`). The CPU of
each service process (user + system, /proc) is read from before the write until the relay has
published everything and every JetStream consumer has taken and acknowledged it (and, with the
webhook, until the receiver has every delivery), divided by the events. The relay's share is the
records column; the consumers' are webhooks, workflows and gateway. CPU time hardly depends on
what else the machine runs; the events/s column does (report it as measured under load).
With RECORD_EVENTS_PUBLISH=interested (the default) the relay skips the events of the workspace
nobody listens to (docs/events.md, "Who listens"): that row is the relay's cost of marking them,
and the consumers' columns stay near zero.

    .venv/bin/python bench/bench_events.py            # starts a stack: 5,000 events per case
    .venv/bin/python bench/bench_events.py --smoke    # 500 per case
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import aiohttp
import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.bench_relay import write_backlog
from bench.bench_webhooks import Receiver, _signup
from bench.benchlib import (
    CREATE_WEBHOOK,
    BenchContext,
    CpuMeter,
    Result,
    TreeCpu,
    client_session,
    graphql_data,
    main_on_own_stack,
)
from bench.settle import _backlog
from crmstack.ports import free_port

CONSUMERS = ("webhooks", "workflows", "gateway")


async def _webhook(
    http: aiohttp.ClientSession, headers: dict[str, str], url: str
) -> tuple[str, str]:
    """A webhook on every person operation; returns its id and secret."""
    data = await graphql_data(
        http,
        "/graphql",
        headers,
        CREATE_WEBHOOK,
        {"input": {"targetUrl": url, "operations": ["person.*"]}},
    )
    made = data["createWebhook"]
    return str(made["id"]), str(made["secret"])


async def _consumed(ctx: BenchContext, timeout: float = 600) -> None:
    """Until every event is published and every JetStream consumer acknowledged it."""
    deadline = time.monotonic() + timeout
    while (await _backlog(ctx))[:2] != (0, 0):  # events only: autovacuum may go on
        if time.monotonic() > deadline:
            raise RuntimeError("the events were not consumed in time")
        await asyncio.sleep(0.1)


async def _case(
    ctx: BenchContext, name: str, workspace_id: str, count: int, receiver: Receiver | None
) -> Result:
    connection = await asyncpg.connect(ctx.database_url)
    # Under bench/run.py every process of the stack (NATS and PostgreSQL too); run alone, the
    # services only.
    meter: CpuMeter | TreeCpu = (
        TreeCpu(ctx.process_pids) if ctx.process_pids else CpuMeter(ctx.service_pids)
    )
    try:
        await _consumed(ctx)
        meter.start()
        started = time.perf_counter()
        await write_backlog(connection, count, workspace_id)
        await _consumed(ctx)
        if receiver is not None:
            async with client_session(receiver.url) as http:
                results = await receiver.wait_for(http, count, timeout=600)
            if results["count"] < count:
                raise RuntimeError(f"only {results['count']} of {count} deliveries arrived")
        seconds = time.perf_counter() - started
    finally:
        await connection.close()
    cpu = meter.per_request(count)
    consumers = sum(cpu.get(service, 0.0) for service in CONSUMERS)
    return Result(
        operation=f"record event, {name}: CPU per event",
        concurrency=1,
        requests=count,
        seconds=seconds,
        p50_ms=consumers,
        p99_ms=consumers,
        notes="p50/p99: the consumers' CPU ms per event; "
        + ", ".join(f"{service} {cpu.get(service, 0.0):.3f}" for service in CONSUMERS)
        + f"; relay (records) {cpu.get('records', 0.0):.3f}"
        + "".join(f", {part} {cpu[part]:.3f}" for part in ("nats", "postgres") if part in cpu)
        + " ms",
        cpu_ms_per_request=cpu,
    )


async def run(ctx: BenchContext) -> list[Result]:
    count = 500 if ctx.smoke else 5_000
    rows = [await _case(ctx, "no listener", "", count, None)]
    port = free_port()
    async with client_session(ctx.base_url) as http:
        headers = await _signup(http)
        webhook_id, secret = await _webhook(http, headers, f"http://127.0.0.1:{port}/hook")
    connection = await asyncpg.connect(ctx.database_url)
    try:
        workspace_id = await connection.fetchval(
            "SELECT workspace_id::text FROM webhooks.webhooks WHERE id = $1", webhook_id
        )
    finally:
        await connection.close()
    receiver = Receiver(port, secret)
    try:
        rows.append(await _case(ctx, "1 matching webhook", workspace_id, count, receiver))
    finally:
        receiver.stop()
    return rows


if __name__ == "__main__":
    main_on_own_stack(run, __doc__ or "", "events")

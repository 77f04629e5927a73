"""Import rate: a CSV of a 6-field object uploaded to POST /rest/imports/{object}, timed from the
first byte sent to the job's `succeeded`, with record events off, on with nobody listening, and
on while somebody listens to the workspace (a webhook on another object: every event is written,
published and read by the webhooks, workflows and gateway consumers; CPU and memory are counted
until the consumers have read them all).

Rows: BENCH_IMPORT_ROWS (default 1,000,000; 2,000 in smoke mode). Budgets (issue 21): at least
25,000 rows/s with events off, 10,000 with events on, and no process's resident memory growing
by 100 MB or more. Each row also reports the CPU time per row of every part of the stack (the
services, PostgreSQL with its backends, NATS, Valkey), which hardly depends on the machine's
load, unlike the wall time.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import nats
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from bench.benchlib import (
    CREATE_WEBHOOK,
    BenchContext,
    Result,
    TreeCpu,
    TreeMemory,
    client_session,
    graphql_data,
    main_on_own_stack,
)
from bench.seed import signup
from crmkit.messaging import RECORD_EVENTS_STREAM

BUDGETS = {False: 25_000.0, True: 10_000.0}  # rows/s, by events on
DRAIN_TIMEOUT = 600.0  # seconds the consumers may take to read a listened import's events
BUDGET_GROWTH_MB = 100.0
FIELDS = (
    ("code", "TEXT", True),
    ("title", "TEXT", False),
    ("qty", "NUMBER", False),
    ("price", "NUMBER", False),
    ("active", "BOOLEAN", False),
    ("madeOn", "DATE", False),
)


async def _metadata(
    http: aiohttp.ClientSession, headers: dict[str, str], query: str, variables: dict[str, Any]
) -> dict[str, Any]:
    return await graphql_data(http, "/metadata", headers, query, variables)


async def _workspace(http: aiohttp.ClientSession) -> dict[str, str]:
    account = await signup(http, "", "Import bench")
    headers = {"Authorization": f"Bearer {account['accessToken']}"}
    created = await _metadata(
        http,
        headers,
        "mutation($input: CreateObjectInput!) { createObject(input: $input) { id } }",
        {
            "input": {
                "nameSingular": "item",
                "namePlural": "items",
                "labelSingular": "Item",
                "labelPlural": "Items",
            }
        },
    )
    for name, kind, unique in FIELDS:
        await _metadata(
            http,
            headers,
            "mutation($input: CreateFieldInput!) { createField(input: $input) { id } }",
            {
                "input": {
                    "objectMetadataId": created["createObject"]["id"],
                    "name": name,
                    "label": name,
                    "type": kind,
                    "isUnique": unique,
                }
            },
        )
    return headers


async def _csv(rows: int, tag: str) -> AsyncIterator[bytes]:
    yield b"code,title,qty,price,active,madeOn\n"
    for start in range(0, rows, 10_000):
        lines = [
            f"{tag}-{n},Item number {n},{n % 1000},{n % 977}.5,{'true' if n % 2 else 'false'},"
            f"2026-{1 + n % 12:02d}-{1 + n % 28:02d}\n"
            for n in range(start, min(rows, start + 10_000))
        ]
        yield "".join(lines).encode()


async def _listen(http: aiohttp.ClientSession, headers: dict[str, str]) -> None:
    """Somebody listens to the workspace: a webhook on people (none is imported, so it gets no
    delivery), which makes every record event of the workspace written and published."""
    await graphql_data(
        http,
        "/graphql",
        headers,
        CREATE_WEBHOOK,
        {"input": {"targetUrl": "http://127.0.0.1:9/unused", "operations": ["person.created"]}},
    )


async def _drained(nats_url: str) -> float:
    """Seconds until the stream stops growing and every consumer has read and acknowledged it."""
    started = time.perf_counter()
    client = await nats.connect(nats_url)
    try:
        js = client.jetstream()
        last = -1
        while time.perf_counter() - started < DRAIN_TIMEOUT:
            stream = await js.stream_info(RECORD_EVENTS_STREAM)
            consumers = await js.consumers_info(RECORD_EVENTS_STREAM)
            settled = all(c.num_pending == 0 and c.num_ack_pending == 0 for c in consumers)
            if settled and stream.state.last_seq == last:
                return time.perf_counter() - started
            last = stream.state.last_seq
            await asyncio.sleep(0.5)
    finally:
        await client.close()
    raise RuntimeError(f"the consumers did not read the events within {DRAIN_TIMEOUT:.0f} s")


async def _import(
    ctx: BenchContext,
    http: aiohttp.ClientSession,
    headers: dict[str, str],
    rows: int,
    events: bool,
    *,
    listened: bool = False,
) -> Result:
    cpu = TreeCpu(ctx.process_pids)
    memory = TreeMemory(ctx.process_pids)
    cpu.start()
    memory.start()
    started = time.perf_counter()
    async with http.post(
        f"/rest/imports/items?format=csv&events={'true' if events else 'false'}",
        headers=headers,
        data=_csv(rows, "l" if listened else "e" if events else "q"),
        timeout=aiohttp.ClientTimeout(total=3600),
    ) as response:
        body = orjson.loads(await response.read())
        if response.status != 202:
            raise RuntimeError(f"import refused ({response.status}): {body}")
    uploaded = time.perf_counter() - started
    job_id = body["data"]["id"]
    while True:
        async with http.get(f"/rest/imports/{job_id}", headers=headers) as response:
            job = orjson.loads(await response.read())["data"]
        if job["state"] not in ("queued", "running"):
            break
        await asyncio.sleep(0.2)
    seconds = time.perf_counter() - started
    drain = (
        f"; the consumers read the events {await _drained(ctx.nats_url):.1f} s later"
        if (listened and ctx.nats_url)
        else ""
    )
    used = cpu.per_request(rows)
    grown = await memory.stop()
    if job["state"] != "succeeded" or job["rowsWritten"] != rows:
        raise RuntimeError(f"import did not write every row: {job}")
    rate = rows / seconds
    per_row = ", ".join(f"{name} {ms * 1000:.1f}" for name, ms in used.items() if ms)
    growth = ", ".join(f"{name} +{mb:.0f}" for name, mb in grown.items())
    listener = ", somebody listening" if listened else ""
    return Result(
        operation=f"import: CSV, 6 fields, events {'on' if events else 'off'}{listener} (rows/s)",
        concurrency=1,
        requests=rows,
        seconds=seconds,
        p50_ms=0.0,
        p99_ms=0.0,
        budget=f">= {BUDGETS[events]:,.0f} rows/s, RSS < +{BUDGET_GROWTH_MB:.0f} MB",
        passed=rate >= BUDGETS[events] and max(grown.values(), default=0) < BUDGET_GROWTH_MB,
        notes=f"{rows:,} rows, upload {uploaded:.1f} s, {job['sizeBytes']:,} bytes{drain}; "
        f"CPU us/row: {per_row}; RSS growth MB (largest process of each part): {growth}",
        cpu_ms_per_request=used,
    )


async def run(ctx: BenchContext) -> list[Result]:
    rows = 2_000 if ctx.smoke else int(os.environ.get("BENCH_IMPORT_ROWS", "1000000"))
    async with client_session(ctx.base_url) as http:
        headers = await _workspace(http)
        results = [await _import(ctx, http, headers, rows, events) for events in (False, True)]
        await _listen(http, headers)
        results.append(await _import(ctx, http, headers, rows, True, listened=True))
        return results


def main() -> None:
    main_on_own_stack(run, (__doc__ or "").split("\n\n")[0], "imports")


if __name__ == "__main__":
    main()

"""Export throughput and memory (issue 21.6): `GET /rest/people/export?format=ndjson` (and csv)
of a workspace holding N people, read as fast as the client can, while the resident memory of
the gateway and the records service is sampled every 0.1 s.

Budget (full run, 1,000,000 rows): >= 100,000 rows/s as NDJSON; each process grows by < 100 MB
(peak RSS during the export minus RSS before it). The rows are written straight into the
workspace's table with one INSERT ... SELECT (seeding a million rows through the API is the
import's benchmark, not this one's). N: 1,000,000; 20,000 in the smoke run; BENCH_EXPORT_ROWS
overrides it.

    .venv/bin/python bench/bench_export.py [--smoke]
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import asyncpg
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from bench.benchlib import BenchContext, CpuMeter, Result, main_on_own_stack
from bench.seed import signup
from records.sql import workspace_schema_name

FULL_ROWS = 1_000_000
SMOKE_ROWS = 20_000
BUDGET_ROWS_PER_SECOND = 100_000
BUDGET_RSS_MB = 100.0

# Six text fields of a person, like an imported contact list.
_INSERT = """
INSERT INTO {schema}.person (id, "firstName", "lastName", email, "jobTitle", city, phone,
                             "createdAt", "updatedAt")
SELECT gen_random_uuid(), 'First ' || g, 'Last ' || g, 'person' || g || '@example.com',
       'Engineer ' || (g % 97), 'City ' || (g % 1000), '+49 30 ' || g, now(), now()
FROM generate_series(1, $1) AS g
"""


class RssSampler:
    """Peak resident memory of each process while running, against the value at start."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.processes = {name: psutil.Process(pid) for name, pid in pids.items() if pid}
        self.before = {name: p.memory_info().rss for name, p in self.processes.items()}
        self.peak = dict(self.before)
        self._task: asyncio.Task[None] | None = None

    async def _sample(self) -> None:
        while True:
            for name, process in self.processes.items():
                self.peak[name] = max(self.peak[name], process.memory_info().rss)
            await asyncio.sleep(0.1)

    def start(self) -> None:
        self._task = asyncio.create_task(self._sample())

    async def stop(self) -> dict[str, float]:
        if self._task is not None:
            self._task.cancel()
        return {name: (self.peak[name] - self.before[name]) / 2**20 for name in self.processes}


def _postgres_cpu_seconds(database_url: str) -> float:
    """CPU time of the PostgreSQL serving `database_url` and its backends (0 if not local)."""
    port = str(urlsplit(database_url).port or 5432)
    total = 0.0
    for process in psutil.process_iter(["name", "cmdline"]):
        cmdline = process.info["cmdline"] or []
        if process.info["name"] != "postgres" or port not in cmdline or "-p" not in cmdline:
            continue
        try:
            for member in [process, *process.children()]:
                times = member.cpu_times()
                total += times.user + times.system
        except psutil.Error:
            continue
    return total


async def _seed(ctx: BenchContext, http: aiohttp.ClientSession, rows: int) -> dict[str, str]:
    deadline = time.monotonic() + 60
    while True:  # a just-started stack may answer 503 for a moment (an upstream not ready)
        try:
            account = await signup(http, ctx.base_url, "Export bench")
            break
        except RuntimeError as exc:
            if "(503)" not in str(exc) or time.monotonic() > deadline:
                raise
            await asyncio.sleep(1)
    schema = workspace_schema_name(account["workspace"]["id"])
    connection = await asyncpg.connect(ctx.database_url)
    try:
        for start in range(0, rows, 200_000):
            await connection.execute(
                _INSERT.format(schema=f'"{schema}"'), min(200_000, rows - start)
            )
        await connection.execute(f'ANALYZE "{schema}".person')
    finally:
        await connection.close()
    return {"Authorization": f"Bearer {account['accessToken']}"}


async def _export(
    ctx: BenchContext, http: aiohttp.ClientSession, headers: dict[str, str], fmt: str, rows: int
) -> Result:
    sampler = RssSampler(ctx.service_pids)
    sampler.start()
    cpu = CpuMeter(ctx.service_pids)
    cpu.start()
    postgres_before = _postgres_cpu_seconds(ctx.database_url)
    started = time.perf_counter()
    received = lines = 0
    async with http.get(
        f"{ctx.base_url}/rest/people/export",
        params={"format": fmt},
        headers=headers,
        timeout=aiohttp.ClientTimeout(total=3600),
    ) as response:
        if response.status != 200:
            raise RuntimeError(f"export failed ({response.status}): {await response.text()}")
        first_byte = time.perf_counter() - started
        async for chunk in response.content.iter_chunked(1 << 20):
            received += len(chunk)
            lines += chunk.count(b"\n")
    seconds = time.perf_counter() - started
    cpu_ms = cpu.per_request(1)
    cpu_ms["postgres"] = (_postgres_cpu_seconds(ctx.database_url) - postgres_before) * 1000
    grown = await sampler.stop()
    records = lines - 1 if fmt == "csv" else lines  # the header line
    if records != rows:
        raise RuntimeError(f"{fmt} export had {records} rows, expected {rows}")
    rate = rows / seconds
    memory = ", ".join(f"{name} +{mb:.0f} MB" for name, mb in sorted(grown.items()))
    # CPU per row hardly depends on what else the machine runs (wall time does).
    per_row = ", ".join(f"{name} {ms * 1000 / rows:.1f}" for name, ms in sorted(cpu_ms.items()))
    budgeted = fmt == "ndjson"
    passed = rate >= BUDGET_ROWS_PER_SECOND and max(grown.values(), default=0) < BUDGET_RSS_MB
    return Result(
        operation=f"export {rows:,} people as {fmt}",
        concurrency=1,
        requests=rows,
        seconds=seconds,
        p50_ms=first_byte * 1000,
        p99_ms=seconds * 1000,
        budget=f">= {BUDGET_ROWS_PER_SECOND:,} rows/s, RSS < +{BUDGET_RSS_MB:.0f} MB"
        if budgeted
        else "",
        passed=passed if budgeted and not ctx.smoke else None,
        notes=f"{rate:,.0f} rows/s, {received / 2**20:.0f} MiB; RSS peak growth: {memory}; "
        f"CPU us/row: {per_row}; p50 = first byte, p99 = whole export",
    )


async def run(ctx: BenchContext) -> list[Result]:
    rows = int(os.environ.get("BENCH_EXPORT_ROWS", SMOKE_ROWS if ctx.smoke else FULL_ROWS))
    async with aiohttp.ClientSession() as http:
        headers = await _seed(ctx, http, rows)
        return [
            await _export(ctx, http, headers, "ndjson", rows),
            await _export(ctx, http, headers, "csv", rows),
        ]


if __name__ == "__main__":
    main_on_own_stack(run, __doc__ or "", "export")

"""Webhook deliveries from commit to a fast receiver on loopback.

1. Sustained throughput: batches of people created through `POST /rest/batch/people` by a few
   concurrent writers; events/s = events / (last arrival - first commit). Budget: at least 1,000
   deliveries/s.
2. Latency at 100 events/s: one `POST /rest/people` every 10 ms; commit-to-delivery per event.
   Budget: p99 under 100 ms.

Commit time is the payload's `timestamp` (the write's transaction time, on the database's clock);
arrival is the receiver's clock; both run on this machine. The receiver (`bench/webhook_sink.py`,
a separate process) verifies every signature and timestamp with `examples/webhook_receiver.py`.

    .venv/bin/python bench/bench_webhooks.py            # starts a stack, full run
    .venv/bin/python bench/bench_webhooks.py --smoke    # seconds, proves it works
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.benchlib import (
    CREATE_WEBHOOK,
    BenchContext,
    Result,
    TreeCpu,
    client_session,
    graphql_data,
    main_on_own_stack,
    paced,
    percentile,
)
from bench.seed import signup
from crmstack.ports import free_port, wait_for_port

THROUGHPUT_BUDGET = 1000.0  # deliveries per second
P99_BUDGET_MS = 100.0
SINK = Path(__file__).resolve().parent / "webhook_sink.py"


class Receiver:
    """bench/webhook_sink.py in its own process (without a secret: unsigned requests)."""

    def __init__(self, port: int, secret: str | None) -> None:
        self.url = f"http://127.0.0.1:{port}"
        signed = ["--secret", secret] if secret is not None else []
        self.process = subprocess.Popen(
            [sys.executable, str(SINK), "--port", str(port), *signed],
            stdout=subprocess.DEVNULL,
        )
        if not wait_for_port(port, 30):
            self.process.kill()
            raise RuntimeError("the benchmark receiver did not start")

    async def results(self, http: aiohttp.ClientSession) -> dict[str, Any]:
        async with http.get(self.url + "/results") as response:
            body: dict[str, Any] = orjson.loads(await response.read())
        return body

    async def reset(self, http: aiohttp.ClientSession) -> None:
        async with http.post(self.url + "/reset") as response:
            response.raise_for_status()

    async def wait_for(
        self, http: aiohttp.ClientSession, count: int, timeout: float
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            results = await self.results(http)
            if results["count"] >= count or time.monotonic() > deadline:
                return results
            await asyncio.sleep(0.2)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()


async def _signup(http: aiohttp.ClientSession) -> dict[str, str]:
    account = await signup(http, "", "Webhook bench")  # relative: the session's base URL
    return {"Authorization": f"Bearer {account['accessToken']}"}


async def _create_webhook(http: aiohttp.ClientSession, headers: dict[str, str], url: str) -> str:
    data = await graphql_data(
        http,
        "/graphql",
        headers,
        CREATE_WEBHOOK,
        {"input": {"targetUrl": url, "operations": ["person.created"]}},
    )
    secret: str = data["createWebhook"]["secret"]
    return secret


async def _throughput(
    http: aiohttp.ClientSession,
    headers: dict[str, str],
    receiver: Receiver,
    events: int,
    meter: TreeCpu,
) -> Result:
    await receiver.reset(http)
    batch = 500
    writers = 4
    queue: asyncio.Queue[int] = asyncio.Queue()
    for start in range(0, events, batch):
        queue.put_nowait(min(batch, events - start))

    async def writer() -> None:
        while not queue.empty():
            size = queue.get_nowait()
            rows = [{"firstName": f"t{i}"} for i in range(size)]
            async with http.post("/rest/batch/people", headers=headers, json=rows) as response:
                response.raise_for_status()
                await response.read()

    started = time.time()
    meter.start()
    await asyncio.gather(*(writer() for _ in range(writers)))
    results = await receiver.wait_for(http, events, timeout=300)
    used = meter.seconds()
    arrived = [event[2] for event in results["events"]]
    delays = [event[1] for event in results["events"]]
    first_commit = min(at - delay / 1000 for _, delay, at in results["events"]) if arrived else 0
    seconds = (max(arrived) - first_commit) if arrived else time.time() - started
    count = results["count"]
    rate = count / seconds if seconds > 0 else 0.0
    # Every process of the chain, the verifying receiver included: what a delivery costs.
    parts = sorted((part for part in used if used[part] > 0), key=lambda p: -used[p])
    cpu = ", ".join(f"{part} {used[part] * 1e6 / max(count, 1):.0f}" for part in parts)
    return Result(
        operation="webhook: commit -> receiver, sustained",
        concurrency=writers,
        requests=count,
        seconds=seconds,
        p50_ms=percentile(delays, 50),
        p99_ms=percentile(delays, 99),
        budget=f">= {THROUGHPUT_BUDGET:.0f} deliveries/s",
        passed=count == events and rate >= THROUGHPUT_BUDGET,
        notes=f"{count}/{events} delivered, {results['rejected']} rejected; "
        f"batches of {batch} via REST; delays include queueing; CPU us/delivery: {cpu}",
        cpu_ms_per_request={part: round(used[part] * 1000 / max(count, 1), 4) for part in parts},
    )


async def _latency(
    http: aiohttp.ClientSession, headers: dict[str, str], receiver: Receiver, seconds: float
) -> Result:
    await receiver.reset(http)
    rate = 100.0
    total = int(seconds * rate)
    gate = asyncio.Semaphore(64)
    failures: list[int] = []

    async def create(index: int) -> None:
        async with (
            gate,
            http.post("/rest/people", headers=headers, json={"firstName": f"l{index}"}) as response,
        ):
            await response.read()
            if response.status != 201:
                failures.append(response.status)

    # The writer's real pace: the row's events/s says whether it kept up with the rate.
    elapsed = await paced(total, rate, create)
    results = await receiver.wait_for(http, total - len(failures), timeout=120)
    delays = [event[1] for event in results["events"]]
    p99 = percentile(delays, 99)
    return Result(
        operation="webhook: commit -> receiver at 100 events/s",
        concurrency=1,
        requests=results["count"],
        seconds=elapsed,
        p50_ms=percentile(delays, 50),
        p99_ms=p99,
        budget=f"p99 < {P99_BUDGET_MS:.0f} ms",
        passed=results["count"] == total and not failures and p99 < P99_BUDGET_MS,
        notes=f"{results['count']}/{total} delivered, {len(failures)} writes failed, "
        f"{results['rejected']} rejected",
    )


async def run(ctx: BenchContext) -> list[Result]:
    port = free_port()
    async with client_session(ctx.base_url) as http:
        headers = await _signup(http)
        secret = await _create_webhook(http, headers, f"http://127.0.0.1:{port}/hook")
        receiver = Receiver(port, secret)
        try:
            events = 200 if ctx.smoke else 20_000
            latency_seconds = 1.0 if ctx.smoke else 30.0
            # Latency first, on a quiet pipeline; then the sustained load.
            latency = await _latency(http, headers, receiver, latency_seconds)
            meter = TreeCpu({**ctx.process_pids, "receiver": [receiver.process.pid]})
            throughput = await _throughput(http, headers, receiver, events, meter)
            return [throughput, latency]
        finally:
            receiver.stop()


def main() -> None:
    main_on_own_stack(run, __doc__.split("\n\n")[0], "webhooks")


if __name__ == "__main__":
    main()

"""Workflow runs from the triggering write to the request's arrival at a fast receiver.

Latency at 50 events/s: one `POST /rest/opportunities` every 20 ms, with an active
RECORD_CREATED workflow posting `{"id": "{{id}}", "timestamp": "{{createdAt}}"}` to the
receiver; trigger-to-request per event = arrival - the record's createdAt (the write's
transaction time, on the database's clock; both clocks are this machine's). Budget: p99 under
250 ms. The receiver is `bench/webhook_sink.py` without a secret (workflow requests are not
signed), in its own process.

    .venv/bin/python bench/bench_workflows.py            # starts a stack, 30 s at 50 events/s
    .venv/bin/python bench/bench_workflows.py --smoke    # seconds, proves it works
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.bench_webhooks import Receiver
from bench.benchlib import (
    BenchContext,
    Result,
    client_session,
    main_on_own_stack,
    paced,
    percentile,
)
from bench.seed import signup
from crmstack.ports import free_port

RATE = 50.0  # events per second
P99_BUDGET_MS = 250.0
BODY = '{"id": "{{id}}", "timestamp": "{{createdAt}}"}'


async def _signup(http: aiohttp.ClientSession) -> dict[str, str]:
    account = await signup(http, "", "Workflow bench")  # relative: the session's base URL
    return {"Authorization": f"Bearer {account['accessToken']}"}


async def _graphql(
    http: aiohttp.ClientSession, headers: dict[str, str], query: str, variables: dict[str, Any]
) -> dict[str, Any]:
    async with http.post(
        "/graphql", headers=headers, json={"query": query, "variables": variables}
    ) as response:
        body: dict[str, Any] = orjson.loads(await response.read())
    if body.get("errors"):
        raise RuntimeError(f"GraphQL call failed: {body['errors']}")
    data: dict[str, Any] = body["data"]
    return data


async def _create_workflow(http: aiohttp.ClientSession, headers: dict[str, str], url: str) -> str:
    created = await _graphql(
        http,
        headers,
        "mutation($input: CreateWorkflowInput!) { createWorkflow(input: $input) { id } }",
        {
            "input": {
                "name": "bench",
                "trigger": {"type": "RECORD_CREATED", "object": "opportunity"},
                "action": {"url": url, "body": BODY},
            }
        },
    )
    workflow_id: str = created["createWorkflow"]["id"]
    await _graphql(
        http,
        headers,
        "mutation($id: UUID!) { activateWorkflow(id: $id) { status } }",
        {"id": workflow_id},
    )
    return workflow_id


async def _latency(
    http: aiohttp.ClientSession, headers: dict[str, str], receiver: Receiver, seconds: float
) -> Result:
    await receiver.reset(http)
    total = int(seconds * RATE)
    gate = asyncio.Semaphore(64)
    failures: list[int] = []

    async def create(index: int) -> None:
        async with (
            gate,
            http.post(
                "/rest/opportunities", headers=headers, json={"name": f"d{index}"}
            ) as response,
        ):
            await response.read()
            if response.status != 201:
                failures.append(response.status)

    # The writer's real pace: the row's events/s says whether it kept up with the rate.
    elapsed = await paced(total, RATE, create)
    results = await receiver.wait_for(http, total - len(failures), timeout=120)
    delays = [event[1] for event in results["events"]]
    p99 = percentile(delays, 99)
    return Result(
        operation=f"workflow: trigger -> request at {RATE:.0f} events/s",
        concurrency=1,
        requests=results["count"],
        seconds=elapsed,
        p50_ms=percentile(delays, 50),
        p99_ms=p99,
        budget=f"p99 < {P99_BUDGET_MS:.0f} ms",
        passed=results["count"] == total and not failures and p99 < P99_BUDGET_MS,
        notes=f"{results['count']}/{total} requests received, {len(failures)} writes failed, "
        f"{results['rejected']} rejected",
    )


async def run(ctx: BenchContext) -> list[Result]:
    port = free_port()
    receiver = Receiver(port, None)
    try:
        async with client_session(ctx.base_url) as http:
            headers = await _signup(http)
            await _create_workflow(http, headers, f"http://127.0.0.1:{port}/flow")
            return [await _latency(http, headers, receiver, 2.0 if ctx.smoke else 30.0)]
    finally:
        receiver.stop()


def main() -> None:
    main_on_own_stack(run, __doc__.split("\n\n")[0], "workflows")


if __name__ == "__main__":
    main()

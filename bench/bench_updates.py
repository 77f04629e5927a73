"""Updates of one record through REST and GraphQL: CPU per request of every process, side by side.

`PATCH /rest/people/{id}` and `mutation { updatePerson(id:, data:) { ... } }` setting a new
`jobTitle` on one of 1,200 people (each call the next person, so 16 connections rarely wait on
one row), 16 connections, in 4 interleaved rounds of 4 s each (the VM's drift falls on both rows
alike); the event chain drained after each round, inside its CPU window, as in
bench_throughput. Budget (issue 18's, applied to updates): GraphQL's CPU per update at most 1.3x
REST's, measured in the same run. The load is the Python closed loop (`benchlib.drive`): wrk's
scripts send one request shape, and an update needs a different record per call.

    .venv/bin/python bench/bench_updates.py            # about 1 minute
    .venv/bin/python bench/bench_updates.py --smoke
"""

from __future__ import annotations

import secrets
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from bench.bench_throughput import CONNECTIONS, CPU_RATIO_BUDGET, FIELDS, prepare
from bench.benchlib import (
    BenchContext,
    Result,
    TreeCpu,
    client_session,
    drive,
    main_on_own_stack,
    percentile,
)
from bench.settle import settle

ROUNDS, SMOKE_ROUNDS = 4, 1
SECONDS, SMOKE_SECONDS = 4.0, 1.0
REST_ROW = "REST update person"
GRAPHQL_ROW = "GraphQL update person"
UPDATE = (
    "mutation($id: UUID!, $d: PersonUpdateInput!) { updatePerson(id: $id, data: $d) "
    f"{{ {FIELDS} }} }}"
)

Call = Callable[[aiohttp.ClientSession, dict[str, str], str, str], Awaitable[None]]


async def _rest(http: aiohttp.ClientSession, headers: dict[str, str], rid: str, title: str) -> None:
    body = orjson.dumps({"jobTitle": title})
    async with http.patch(f"/rest/people/{rid}", data=body, headers=headers) as response:
        answer = await response.read()
        if response.status != 200 or orjson.loads(answer)["data"]["jobTitle"] != title:
            raise RuntimeError(f"{REST_ROW}: {response.status} {answer[:200]!r}")


async def _graphql(
    http: aiohttp.ClientSession, headers: dict[str, str], rid: str, title: str
) -> None:
    body = orjson.dumps({"query": UPDATE, "variables": {"id": rid, "d": {"jobTitle": title}}})
    async with http.post("/graphql", data=body, headers=headers) as response:
        answer = orjson.loads(await response.read())
        if (answer.get("data") or {}).get("updatePerson", {}).get("jobTitle") != title:
            raise RuntimeError(f"{GRAPHQL_ROW}: {response.status} {str(answer)[:200]}")


async def _ids(http: aiohttp.ClientSession, headers: dict[str, str]) -> list[str]:
    ids: list[str] = []
    after = ""
    while True:
        async with http.get(f"/rest/people?limit=200{after}", headers=headers) as response:
            page = orjson.loads(await response.read())
        ids += [row["id"] for row in page["data"]]
        if not page["pageInfo"]["hasNextPage"]:
            return ids
        after = f"&after={page['pageInfo']['endCursor']}"


async def _round(
    ctx: BenchContext, http: aiohttp.ClientSession, headers: dict[str, str], ids: list[str],
    call: Call, seconds: float,
) -> tuple[int, float, dict[str, float], list[float], int]:  # fmt: skip
    tag = secrets.token_hex(3)

    async def one(index: int) -> None:
        await call(http, headers, ids[index % len(ids)], f"T{tag}-{index}")

    await settle(ctx, timeout=30 if ctx.smoke else 300)
    meter = TreeCpu(ctx.process_pids)
    meter.start()
    samples = await drive(one, concurrency=CONNECTIONS, requests=10**9, max_seconds=seconds)
    await settle(ctx, timeout=30 if ctx.smoke else 300)
    used = meter.seconds()
    if samples.first_error:
        print(f"  first error: {samples.first_error}", flush=True)
    return samples.count, samples.seconds, used, samples.latencies_ms, samples.errors


async def run(ctx: BenchContext) -> list[Result]:
    rounds = SMOKE_ROUNDS if ctx.smoke else ROUNDS
    seconds = SMOKE_SECONDS if ctx.smoke else SECONDS
    key = await prepare(ctx.base_url)
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    rows = {REST_ROW: _rest, GRAPHQL_ROW: _graphql}
    totals: dict[str, dict[str, float]] = {name: {} for name in rows}
    counts = dict.fromkeys(rows, 0)
    spent = dict.fromkeys(rows, 0.0)
    errors = dict.fromkeys(rows, 0)
    latencies: dict[str, list[float]] = {name: [] for name in rows}
    async with client_session(ctx.base_url, CONNECTIONS) as http:
        ids = await _ids(http, headers)
        for number in range(1, rounds + 1):
            for name, call in rows.items():
                count, took, used, lat, failed = await _round(
                    ctx, http, headers, ids, call, seconds
                )
                counts[name] += count
                spent[name] += took
                errors[name] += failed
                latencies[name] += lat
                for part, value in used.items():
                    totals[name][part] = totals[name].get(part, 0.0) + value
                print(
                    f"  round {number}/{rounds} {name}: {count / took:.0f}/s, cpu ms/request "
                    f"{sum(used.values()) * 1000 / max(count, 1):.2f}",
                    flush=True,
                )
    results: dict[str, Result] = {}
    for name in rows:
        count = max(counts[name], 1)
        cpu = {part: round(s * 1000 / count, 3) for part, s in totals[name].items()}
        cpu["total"] = round(sum(totals[name].values()) * 1000 / count, 3)
        results[name] = Result(
            operation=name,
            concurrency=CONNECTIONS,
            requests=counts[name],
            seconds=spent[name],
            p50_ms=percentile(sorted(latencies[name]), 50),
            p99_ms=percentile(sorted(latencies[name]), 99),
            errors=errors[name],
            notes=f"Python closed loop, {rounds} rounds; cpu ms/request: "
            + ", ".join(f"{part} {ms:.2f}" for part, ms in cpu.items()),
            cpu_ms_per_request=cpu,
            budget=f"cpu {cpu['total']:.2f} ms/request",
        )
    rest, graphql = results[REST_ROW], results[GRAPHQL_ROW]
    ratio = graphql.cpu_ms_per_request["total"] / max(rest.cpu_ms_per_request["total"], 1e-9)
    graphql.budget = (
        f"cpu {graphql.cpu_ms_per_request['total']:.2f} = {ratio:.2f}x REST update "
        f"<= {CPU_RATIO_BUDGET}x"
    )
    graphql.passed = graphql.errors == 0 and ratio <= CPU_RATIO_BUDGET
    return [rest, graphql]


def main() -> None:
    main_on_own_stack(run, (__doc__ or "").split("\n\n")[0], "updates")


if __name__ == "__main__":
    main()

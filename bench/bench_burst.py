"""A rate-limited burst: one API key sends more requests than its limit allows, as fast as it can.

The benchmark stack raises `API_RATE_LIMITING_LIMIT` so the other workloads measure the API, not
the limiter; this workload asks the runner for one more gateway with the spec's default limit
(100 requests per 60 s per API key) and bursts 300 requests at concurrency 32 through it. It
reports requests/s and latency of every answer, and counts the 429s: with a limiter, about 200
of the 300 must be refused (more than 100 or fewer than 95 accepted is a FAIL; the setup's own
calls may spend a few of the key's workspace budget). Without a limiter (no `X-RateLimit-Limit`
header on answers) the row says `not limited` and has no verdict, instead of failing.

The cost of one limit check (budget p50 < 0.3 ms) is measured by `bench/bench_rate_limit.py`.
"""

from __future__ import annotations

from collections import Counter

import aiohttp

from bench.benchlib import BenchContext, Result, compare, drive
from bench.seed import signup

LIMIT = 100
WINDOW_MS = 60_000
BURST = 300
CONCURRENCY = 32
LIMITED_ENV = {"API_RATE_LIMITING_LIMIT": str(LIMIT), "API_RATE_LIMITING_TTL": str(WINDOW_MS)}

CREATE_KEY = """mutation { createApiKey(input: {name: "burst", expiresAt: "2099-01-01T00:00:00Z"})
  { token } }"""


async def _api_key(http: aiohttp.ClientSession, base_url: str, token: str) -> str:
    async with http.post(
        base_url + "/graphql",
        json={"query": CREATE_KEY},
        headers={"Authorization": f"Bearer {token}"},
    ) as response:
        body = await response.json()
    if body.get("errors"):
        raise RuntimeError(f"createApiKey failed: {body['errors']}")
    key: str = body["data"]["createApiKey"]["token"]
    return key


async def run(ctx: BenchContext) -> list[Result]:
    base_url = ctx.base_url
    where = "the benchmark gateway (limit raised)"
    if ctx.start_gateway is not None:
        base_url = await ctx.start_gateway(LIMITED_ENV)
        where = f"a gateway with API_RATE_LIMITING_LIMIT={LIMIT}/{WINDOW_MS // 1000}s"
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=CONCURRENCY),
        timeout=aiohttp.ClientTimeout(total=60),
    ) as http:
        # The key's workspace is new, so nothing else has spent its budget.
        account = await signup(http, base_url, "Burst bench")
        key = await _api_key(http, base_url, account["accessToken"])
        headers = {"Authorization": f"Bearer {key}"}
        limit_header: list[str] = []
        statuses: Counter[int] = Counter()

        async def call(index: int) -> object:
            async with http.get(base_url + "/rest/companies?limit=1", headers=headers) as response:
                await response.read()
                statuses[response.status] += 1
                if "X-RateLimit-Limit" in response.headers and not limit_header:
                    limit_header.append(response.headers["X-RateLimit-Limit"])
                if response.status not in (200, 429):
                    raise RuntimeError(f"unexpected status {response.status}")
            return None

        measured = await drive(call, concurrency=CONCURRENCY, requests=BURST, max_seconds=60)
        measured.statuses = statuses
    refused = measured.statuses.get(429, 0)
    accepted = measured.statuses.get(200, 0)
    name = f"rate-limited burst: {BURST} requests, 1 API key"
    if not limit_header and refused == 0:
        return [
            compare(
                name,
                CONCURRENCY,
                measured,
                None,
                budget="not limited",
                notes=f"no X-RateLimit-Limit header and no 429 via {where}: "
                f"no limiter yet ({accepted} x 200)",
            )
        ]
    # The setup calls (createApiKey) may count against the same workspace budget.
    expected = BURST - LIMIT
    return [
        compare(
            name,
            CONCURRENCY,
            measured,
            None,
            budget=f"{expected} x 429 of {BURST}",
            check=lambda row: LIMIT - 5 <= accepted <= LIMIT and accepted + refused == BURST,
            notes=f"{accepted} x 200, {refused} x 429 via {where}; "
            f"X-RateLimit-Limit {limit_header[0] if limit_header else '-'}",
        )
    ]

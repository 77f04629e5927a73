"""The benchmark data set, written through the batch API: a workspace with companies, people
(each at a company) and opportunities (each at a company with a point of contact, a stage, an
amount, a close date and a probability).

Batches of 1000 go through `POST /rest/batch/{object}` from a few concurrent writers, companies
first (their ids are needed by the others), then people, then opportunities. Values come from a
seeded random generator, so two runs seed the same shapes.
"""

from __future__ import annotations

import asyncio
import random
import secrets
import time
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any

import aiohttp
import asyncpg
import orjson

from bench.benchlib import Result, Seed, percentile
from records.sql import quote, workspace_schema_name

BATCH = 1000
WRITERS = 4
STAGES = ("PROSPECTING", "QUALIFIED", "PROPOSAL", "NEGOTIATION", "WON", "LOST")
JOB_TITLES = (
    "Engineer",
    "Designer",
    "Account Executive",
    "Product Manager",
    "Data Scientist",
    "Sales Manager",
    "Support Lead",
    "Marketing Lead",
    "CTO",
    "CFO",
    "Recruiter",
    "Analyst",
)
FIRST = ("Ada", "Alan", "Grace", "Linus", "Barbara", "Ken", "Margaret", "Dennis", "Frances",
         "John", "Radia", "Tim", "Edsger", "Donald", "Leslie", "Niklaus", "Hedy", "Claude",
         "Sophie", "Guido")  # fmt: skip
LAST = ("Lovelace", "Turing", "Hopper", "Torvalds", "Liskov", "Thompson", "Hamilton", "Ritchie",
        "Allen", "McCarthy", "Perlman", "Berners-Lee", "Dijkstra", "Knuth", "Lamport", "Wirth",
        "Lamarr", "Shannon", "Wilson", "Rossum")  # fmt: skip
CITIES = ("London", "Paris", "Berlin", "Madrid", "Rome", "Lisbon", "Dublin", "Vienna", "Prague",
          "Warsaw", "Oslo", "Zurich")  # fmt: skip
INDUSTRIES = ("Software", "Retail", "Finance", "Health", "Energy", "Media", "Logistics")


@dataclass(frozen=True)
class Sizes:
    companies: int
    people: int
    opportunities: int


FULL = Sizes(companies=10_000, people=100_000, opportunities=20_000)
SMOKE = Sizes(companies=200, people=1_000, opportunities=400)


async def signup(http: aiohttp.ClientSession, base_url: str, name: str) -> dict[str, Any]:
    """A new workspace and its admin; answers the signup body (accessToken, workspace...)."""
    async with http.post(
        base_url + "/auth/signup",
        json={
            "email": f"bench-{secrets.token_hex(6)}@example.com",
            "password": "bench password " + secrets.token_hex(4),
            "firstName": "Bench",
            "lastName": "Mark",
            "workspaceName": name,
        },
    ) as response:
        body: dict[str, Any] = orjson.loads(await response.read())
        if response.status >= 300:
            raise RuntimeError(f"signup failed ({response.status}): {body}")
        return body


class _Writer:
    """Posts batches from a queue with a few concurrent writers; reports progress."""

    def __init__(self, http: aiohttp.ClientSession, base_url: str, headers: dict[str, str]):
        self.http = http
        self.base_url = base_url
        self.headers = headers
        self.latencies: list[float] = []
        self.written = 0
        self.seconds = 0.0

    async def post(self, plural: str, rows: list[dict[str, Any]]) -> list[str]:
        started = time.perf_counter()
        async with self.http.post(
            f"{self.base_url}/rest/batch/{plural}",
            data=orjson.dumps(rows),
            headers={**self.headers, "Content-Type": "application/json"},
        ) as response:
            body = await response.read()
            if response.status != 201:
                raise RuntimeError(f"batch of {plural} failed ({response.status}): {body[:300]!r}")
        self.latencies.append((time.perf_counter() - started) * 1000)
        return [item["id"] for item in orjson.loads(body)["data"]]

    async def write(self, plural: str, batches: list[list[dict[str, Any]]]) -> list[str]:
        ids: list[list[str]] = [[] for _ in batches]
        total = sum(len(batch) for batch in batches)
        queue = list(enumerate(batches))
        done = 0
        started = time.perf_counter()
        last_report = started

        async def worker() -> None:
            nonlocal done, last_report
            while queue:
                index, batch = queue.pop(0)
                ids[index] = await self.post(plural, batch)
                done += len(batch)
                now = time.perf_counter()
                if now - last_report >= 2 or done == total:
                    last_report = now
                    rate = done / (now - started)
                    print(
                        f"  seeding {plural}: {done:>7}/{total} ({rate:,.0f} records/s)", flush=True
                    )

        await asyncio.gather(*(worker() for _ in range(WRITERS)))
        elapsed = time.perf_counter() - started
        self.seconds += elapsed
        self.written += total
        return [record_id for chunk in ids for record_id in chunk]


def _chunks(rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    return [rows[start : start + BATCH] for start in range(0, len(rows), BATCH)]


def _companies(rng: random.Random, count: int) -> list[dict[str, Any]]:
    return [
        {
            "name": f"Company {i:05d} {rng.choice(LAST)}",
            "employees": rng.randint(1, 5000),
            "city": rng.choice(CITIES),
            "industry": rng.choice(INDUSTRIES),
            "website": f"https://company{i}.example.com",
        }
        for i in range(count)
    ]


def _people(rng: random.Random, count: int, companies: list[str]) -> list[dict[str, Any]]:
    return [
        {
            "firstName": rng.choice(FIRST),
            "lastName": f"{rng.choice(LAST)} {i % 997}",
            "email": f"person{i}@example.com",
            "jobTitle": rng.choice(JOB_TITLES),
            "city": rng.choice(CITIES),
            "companyId": rng.choice(companies),
        }
        for i in range(count)
    ]


def _opportunities(
    rng: random.Random, count: int, companies: list[str], people: list[str]
) -> list[dict[str, Any]]:
    start = date(2026, 1, 1)
    return [
        {
            "name": f"Deal {i:05d}",
            "amount": round(rng.uniform(1_000, 250_000), 2),
            "stage": rng.choice(STAGES),
            "closeDate": (start + timedelta(days=rng.randint(0, 365))).isoformat(),
            "probability": rng.choice((10, 25, 50, 75, 90)),
            "companyId": rng.choice(companies),
            "pointOfContactId": rng.choice(people),
        }
        for i in range(count)
    ]


async def analyze(database_url: str, schema: str) -> None:
    """ANALYZE the seeded workspace's tables. In production autovacuum does this within about a
    minute of a bulk load; without it here, the workloads would start on plans made for empty
    tables (a 50-row list sorting every matching row) and autovacuum would switch them to the
    index plans part way through a workload, between a floor and the API it is compared with."""
    connection = await asyncpg.connect(database_url)
    try:
        tables = await connection.fetch(
            "SELECT tablename FROM pg_tables WHERE schemaname = $1 ORDER BY tablename", schema
        )
        for table in tables:
            await connection.execute(f"ANALYZE {quote(schema)}.{quote(table['tablename'])}")
    finally:
        await connection.close()


async def seed(base_url: str, sizes: Sizes) -> tuple[Seed, Result]:
    """Seeds a new workspace; answers it and a row with the seeding throughput."""
    rng = random.Random(8)  # data shapes, not secrets
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as http:
        account = await signup(http, base_url, "Benchmark data set")
        token = account["accessToken"]
        workspace_id = account["workspace"]["id"]
        writer = _Writer(http, base_url, {"Authorization": f"Bearer {token}"})
        companies = _companies(rng, sizes.companies)
        company_ids = await writer.write("companies", _chunks(companies))
        person_ids = await writer.write("people", _chunks(_people(rng, sizes.people, company_ids)))
        opportunity_ids = await writer.write(
            "opportunities",
            _chunks(_opportunities(rng, sizes.opportunities, company_ids, person_ids)),
        )
    seeded = Seed(
        token=token,
        workspace_id=workspace_id,
        schema=workspace_schema_name(workspace_id),
        company_ids=company_ids,
        person_ids=person_ids,
        opportunity_ids=opportunity_ids,
        job_titles=list(JOB_TITLES),
        company_names=[row["name"] for row in companies],
    )
    latencies = sorted(writer.latencies)
    row = Result(
        operation=f"seed: REST batch {BATCH} (records/s = req/s x {BATCH})",
        concurrency=WRITERS,
        requests=len(latencies),
        seconds=writer.seconds,
        p50_ms=percentile(latencies, 50),
        p99_ms=percentile(latencies, 99),
        notes=f"{writer.written} records in {writer.seconds:.1f} s = "
        f"{writer.written / writer.seconds:,.0f} records/s (companies, people, opportunities)",
    )
    return seeded, row

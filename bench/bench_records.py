"""Records through REST and GraphQL against the seeded workspace, each beside its floor: the same
operation done directly against PostgreSQL with asyncpg, in the same run.

Rows (people are the 100k-row table; a filter on jobTitle selects about 1 in 12):

- REST get by id (`GET /rest/people/{id}`, default depth 1: the company nested). Floor: the row
  and its company as JSON by primary key. Budget at concurrency 1: p50 at most 2 ms over the floor.
- REST filtered and sorted list, 50 rows (`filter[jobTitle][eq]`, `orderBy[lastName]=ASC`).
  Floor: the same WHERE / ORDER BY / LIMIT rendering rows as JSON. Budget as for get.
- REST list filtered through the company relation (`filter[company][name][startsWith]`). Floor:
  the EXISTS subquery the records service compiles it to.
- REST create one person (with its company). Floor: the INSERT and its outbox row in one
  statement (what every write must do).
- REST batch of 1000 people. Floor: the same rows and their outbox rows inserted from
  `json_to_recordset` in one statement. Budget: at least 10,000 records/s at concurrency 4.
- GraphQL list of 50 people with `company { id name }`. Floor: one query with the company as a
  correlated subselect.
- GraphQL `opportunitiesAggregate` (count, sum, avg, min, max of amount over two stages) and REST
  `groupBy?field=stage` (count and sums per stage). Floors: the same aggregates in SQL.

Get, list, create and the GraphQL list are also driven at concurrency 32 (throughput; the
floor at 32 too). Every workload first checks one answer of the API (status and shape), so a
broken endpoint fails the run instead of measuring error pages.
"""

from __future__ import annotations

import secrets
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import asyncpg
import orjson

from bench.benchlib import (
    BenchContext,
    CpuMeter,
    Result,
    Samples,
    Seed,
    compare,
    drive,
    p50_over_floor,
)
from bench.settle import settle
from records.sql import quote

PROFILES_ITSELF = True  # one profile per workload below, not one for the module

OVERHEAD_BUDGET_MS = 2.0  # REST get and 50-row list, concurrency 1, p50 over the floor
BATCH_BUDGET = 10_000.0  # records per second through REST batch
BATCH = 1000
HIGH = 32  # the concurrency whose throughput is reported


@dataclass(frozen=True)
class Plan:
    requests: int  # per measured run at concurrency 1
    seconds: float  # cap per measured run
    high_requests: int  # per run at concurrency 32
    high_seconds: float  # cap per run at concurrency 32
    batches: int  # batch requests per run at concurrency 1 (x4 at concurrency 4)
    warmup: int


FULL = Plan(
    requests=1000, seconds=10.0, high_requests=100_000, high_seconds=6.0, batches=12, warmup=30
)
SMOKE = Plan(requests=10, seconds=1.0, high_requests=64, high_seconds=1.0, batches=1, warmup=2)


class CheckFailed(RuntimeError):
    """An API answer did not have the expected status or shape."""


def uuid7() -> str:
    """A time-ordered UUID (as the records service generates), so floor inserts hit the index
    the same way."""
    ms = time.time_ns() // 1_000_000
    rand = secrets.randbits(74)
    value = (ms << 80) | (0x7 << 76) | ((rand >> 62) << 64) | (0b10 << 62) | (rand & (2**62 - 1))
    return str(uuid.UUID(int=value))


class Api:
    """The gateway over HTTP/1.1 keep-alive (aiohttp), as the seeded workspace's admin."""

    def __init__(self, http: aiohttp.ClientSession, base_url: str, seed: Seed) -> None:
        self.http = http
        self.base_url = base_url
        self.headers = {**seed.headers, "Content-Type": "application/json"}

    async def call(
        self,
        method: str,
        path: str,
        *,
        params: list[tuple[str, str]] | None = None,
        body: bytes | None = None,
        expect: int = 200,
    ) -> bytes:
        async with self.http.request(
            method, self.base_url + path, params=params, data=body, headers=self.headers
        ) as response:
            data = await response.read()
            if response.status != expect:
                raise CheckFailed(f"{method} {path}: {response.status} {data[:200]!r}")
            return data

    async def graphql(self, query: str, variables: dict[str, Any]) -> bytes:
        data = await self.call(
            "POST", "/graphql", body=orjson.dumps({"query": query, "variables": variables})
        )
        if data.startswith(b'{"errors"') or b'"errors":[' in data[:200]:
            raise CheckFailed(f"GraphQL errors: {data[:300]!r}")
        return data


class Floor:
    """asyncpg straight to the workspace's tables (the records service's database)."""

    def __init__(self, pool: asyncpg.Pool, seed: Seed) -> None:
        self.pool = pool
        self.seed = seed
        self.schema = quote(seed.schema)

    def table(self, name: str) -> str:
        return f"{self.schema}.{quote(name)}"

    async def object_id(self, table: str) -> str:
        """The object's metadata id, from the table's comment tag `crm:object:<id>`."""
        tag = await self.pool.fetchval(
            "SELECT obj_description(c.oid, 'pg_class') FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2",
            self.seed.schema,
            table,
        )
        return str(tag).removeprefix("crm:object:")


@dataclass
class Env:
    ctx: BenchContext
    seed: Seed
    plan: Plan
    api: Api
    floor: Floor
    pool: asyncpg.Pool


async def _pair(
    env: Env,
    concurrency: int,
    api_call: Callable[[int], Awaitable[object]],
    floor_call: Callable[[int], Awaitable[object]],
    *,
    requests: int | None = None,
    seconds: float | None = None,
) -> tuple[Samples, Samples, dict[str, float]]:
    """The floor, then the API, the same number of times at the same concurrency; also the
    services' CPU time per API request."""
    plan = env.plan
    high = concurrency > 1
    count = requests if requests is not None else (plan.high_requests if high else plan.requests)
    cap = seconds if seconds is not None else (plan.high_seconds if high else plan.seconds)
    warm = min(plan.warmup, count)
    floor = await drive(
        floor_call, concurrency=concurrency, requests=count, max_seconds=cap, warmup=warm
    )
    meter = CpuMeter(env.ctx.service_pids)
    meter.start()
    api = await drive(
        api_call, concurrency=concurrency, requests=count, max_seconds=cap, warmup=warm
    )
    return api, floor, meter.per_request(api.count + api.errors + warm)


def row(
    name: str,
    concurrency: int,
    measured: tuple[Samples, Samples, dict[str, float]],
    **kwargs: Any,
) -> Result:
    api, floor, cpu = measured
    return compare(name, concurrency, api, floor, cpu=cpu, **kwargs)


def _page_sql(json_expression: str, table: str, condition: str, order: str) -> str:
    """A 51-row page's SQL as the records service shapes it: the page is chosen first and JSON
    is built for its rows only (JSON built before a top-N sort would cost every matching row,
    which would make the floor slower than the API it is the floor of)."""
    return (
        f"SELECT ({json_expression})::text FROM (SELECT t.* FROM {table} t "
        f'WHERE t."deletedAt" IS NULL AND {condition} ORDER BY {order} LIMIT 51) t '
        f"ORDER BY {order}"
    )


# -- get by id -------------------------------------------------------------------------------
async def get_by_id(env: Env) -> list[Result]:
    ids = env.seed.person_ids
    person, company = env.floor.table("person"), env.floor.table("company")
    sql = (
        f"SELECT json_build_object('record', row_to_json(t), 'company', (SELECT row_to_json(c) "
        f'FROM {company} c WHERE c.id = t."companyId" AND c."deletedAt" IS NULL))::text '
        f'FROM {person} t WHERE t.id = $1 AND t."deletedAt" IS NULL'
    )
    statement_pool = env.pool

    first = orjson.loads(await env.api.call("GET", f"/rest/people/{ids[0]}"))["data"]
    if first["id"] != ids[0] or not isinstance(first.get("company"), dict):
        raise CheckFailed(f"GET /rest/people/{{id}} answered {first}")

    async def api(i: int) -> object:
        return await env.api.call("GET", f"/rest/people/{ids[i * 7919 % len(ids)]}")

    async def floor(i: int) -> object:
        return await statement_pool.fetchval(sql, uuid.UUID(ids[i * 7919 % len(ids)]))

    budget, check = p50_over_floor(OVERHEAD_BUDGET_MS)
    rows: list[Result] = []
    one = await _pair(env, 1, api, floor)
    rows.append(row("REST get person by id (depth 1)", 1, one, budget=budget, check=check))
    many = await _pair(env, HIGH, api, floor)
    rows.append(row("REST get person by id (depth 1)", HIGH, many, notes="throughput"))
    return rows


# -- lists -----------------------------------------------------------------------------------
async def filtered_list(env: Env) -> list[Result]:
    titles = env.seed.job_titles
    person = env.floor.table("person")
    # Text sorts on its first 256 characters (docs/data-model.md); jobTitle has no btree
    # (isIndexed off), so equality is on the column alone, as records compiles it.
    condition = 't."jobTitle" = $1'
    sql = _page_sql("row_to_json(t)", person, condition, 'left(t."lastName", 256), t.id')

    def params(i: int) -> list[tuple[str, str]]:
        return [
            ("filter[jobTitle][eq]", titles[i % len(titles)]),
            ("orderBy[lastName]", "ASC"),
            ("limit", "50"),
        ]

    page = orjson.loads(await env.api.call("GET", "/rest/people", params=params(0)))["data"]
    if len(page) != min(50, len(env.seed.person_ids)) and len(page) == 0:
        raise CheckFailed("the filtered list answered no rows")
    if any(row["jobTitle"] != titles[0] for row in page) or [r["lastName"] for r in page] != sorted(
        r["lastName"] for r in page
    ):
        raise CheckFailed("the filtered list is not filtered and sorted as asked")

    async def api(i: int) -> object:
        return await env.api.call("GET", "/rest/people", params=params(i))

    async def floor(i: int) -> object:
        async with env.pool.acquire() as connection:
            return await connection.fetch(sql, titles[i % len(titles)])

    budget, check = p50_over_floor(OVERHEAD_BUDGET_MS)
    name = "REST list 50 people, filter + sort"
    one = await _pair(env, 1, api, floor)
    many = await _pair(env, HIGH, api, floor)
    return [
        row(name, 1, one, budget=budget, check=check),
        row(name, HIGH, many, notes="throughput"),
    ]


async def relation_filter_list(env: Env) -> list[Result]:
    person, company = env.floor.table("person"), env.floor.table("company")
    prefixes = [f"Company {n:02d}" for n in range(min(100, max(1, len(env.seed.company_ids))))]
    sql = (
        f"SELECT row_to_json(t)::text FROM {person} t "
        f'WHERE t."deletedAt" IS NULL AND EXISTS (SELECT 1 FROM {company} c '
        f'WHERE c.id = t."companyId" AND c."deletedAt" IS NULL AND c.name LIKE $1 || \'%\') '
        f"ORDER BY t.id LIMIT 51"
    )

    def params(i: int) -> list[tuple[str, str]]:
        return [("filter[company][name][startsWith]", prefixes[i % len(prefixes)]), ("limit", "50")]

    await env.api.call("GET", "/rest/people", params=params(0))

    async def api(i: int) -> object:
        return await env.api.call("GET", "/rest/people", params=params(i))

    async def floor(i: int) -> object:
        async with env.pool.acquire() as connection:
            return await connection.fetch(sql, prefixes[i % len(prefixes)])

    one = await _pair(env, 1, api, floor)
    return [row("REST list 50 people, filter company.name", 1, one)]


# -- writes ----------------------------------------------------------------------------------
def _insert_sql(floor: Floor, object_id: str, workspace_id: str, source: str) -> str:
    """INSERT people from `source` (a FROM item with the columns below) and their outbox rows."""
    person = floor.table("person")
    return (
        f'WITH ins AS (INSERT INTO {person} AS t (id, "firstName", "lastName", email, '
        f'"jobTitle", "companyId", "createdAt", "updatedAt") '
        f'SELECT x.id, x."firstName", x."lastName", x.email, x."jobTitle", x."companyId", '
        f"date_trunc('milliseconds', now()), date_trunc('milliseconds', now()) FROM {source} "
        f"RETURNING t.id, row_to_json(t) AS after), "
        f"ob AS (INSERT INTO records.outbox (event_id, workspace_id, object, object_metadata_id, "
        f"record_id, action, cause, record, actor_kind) SELECT gen_random_uuid(), "
        f"'{workspace_id}'::uuid, 'person', '{object_id}'::uuid, s.id, 'created', 'write', "
        f"s.after, 'user' FROM ins s) SELECT s.after::text FROM ins s"
    )


_RECORDSET = (
    'x(id uuid, "firstName" text, "lastName" text, email text, "jobTitle" text, "companyId" uuid)'
)


def _person(i: int, seed: Seed, tag: str) -> dict[str, Any]:
    return {
        "firstName": "Bench",
        "lastName": f"{tag} {i}",
        "email": f"{tag}-{i}-{secrets.token_hex(3)}@example.com",
        "jobTitle": seed.job_titles[i % len(seed.job_titles)],
        "companyId": seed.company_ids[i % len(seed.company_ids)],
    }


async def create_one(env: Env) -> list[Result]:
    object_id = await env.floor.object_id("person")
    sql = _insert_sql(
        env.floor,
        object_id,
        env.seed.workspace_id,
        "(SELECT ($1::json ->> 'id')::uuid AS id, "
        "$1::json ->> 'firstName' AS \"firstName\", $1::json ->> 'lastName' AS \"lastName\", "
        "$1::json ->> 'email' AS email, $1::json ->> 'jobTitle' AS \"jobTitle\", "
        "($1::json ->> 'companyId')::uuid AS \"companyId\") x",
    )
    created = orjson.loads(
        await env.api.call(
            "POST", "/rest/people", body=orjson.dumps(_person(0, env.seed, "check")), expect=201
        )
    )["data"]
    if not created.get("id") or created.get("companyId") != env.seed.company_ids[0]:
        raise CheckFailed(f"POST /rest/people answered {created}")

    async def api(i: int) -> object:
        body = orjson.dumps(_person(i, env.seed, "api"))
        return await env.api.call("POST", "/rest/people", body=body, expect=201)

    async def floor(i: int) -> object:
        row = {**_person(i, env.seed, "floor"), "id": uuid7()}
        return await env.pool.fetchval(sql, orjson.dumps(row).decode())

    one = await _pair(env, 1, api, floor, requests=env.plan.requests // 2 or 1)
    many = await _pair(env, HIGH, api, floor)
    name = "REST create person (+ outbox event)"
    return [row(name, 1, one), row(name, HIGH, many, notes="throughput")]


async def batch(env: Env) -> list[Result]:
    object_id = await env.floor.object_id("person")
    sql = _insert_sql(
        env.floor,
        object_id,
        env.seed.workspace_id,
        f"json_to_recordset($1::json) AS {_RECORDSET}",
    )

    def rows(i: int, tag: str) -> list[dict[str, Any]]:
        return [_person(i * BATCH + n, env.seed, tag) for n in range(BATCH)]

    async def api(i: int) -> object:
        return await env.api.call(
            "POST", "/rest/batch/people", body=orjson.dumps(rows(i, "batch")), expect=201
        )

    async def floor(i: int) -> object:
        payload = [{**row, "id": uuid7()} for row in rows(i, "floorbatch")]
        async with env.pool.acquire() as connection:
            return await connection.fetch(sql, orjson.dumps(payload).decode())

    name = f"REST batch {BATCH} people (req/s x {BATCH} = rec/s)"
    results = []
    for concurrency in (1, 4):
        count = env.plan.batches * concurrency
        measured = await _pair(env, concurrency, api, floor, requests=count, seconds=60.0)
        rate = measured[0].rate * BATCH
        notes = f"{rate:,.0f} records/s (floor {measured[1].rate * BATCH:,.0f})"
        if concurrency == 4:
            results.append(
                row(
                    name,
                    concurrency,
                    measured,
                    budget=f">= {BATCH_BUDGET:,.0f} records/s",
                    check=lambda row: row.requests_per_second * BATCH >= BATCH_BUDGET,
                    notes=notes,
                )
            )
        else:
            results.append(row(name, concurrency, measured, notes=notes))
    return results


# -- GraphQL and aggregates -------------------------------------------------------------------
PEOPLE_QUERY = """query People($title: String!) {
  people(first: 50, filter: {jobTitle: {eq: $title}}, orderBy: {lastName: ASC}) {
    edges { node { id firstName lastName email company { id name } } }
  }
}"""


async def graphql_list(env: Env) -> list[Result]:
    titles = env.seed.job_titles
    person, company = env.floor.table("person"), env.floor.table("company")
    node = (
        "json_build_object('id', t.id, 'firstName', t.\"firstName\", 'lastName', t.\"lastName\", "
        "'email', t.email, 'company', (SELECT json_build_object('id', c.id, 'name', c.name) "
        f'FROM {company} c WHERE c.id = t."companyId" AND c."deletedAt" IS NULL))'
    )
    sql = _page_sql(node, person, 't."jobTitle" = $1', 't."lastName", t.id')
    answer = orjson.loads(await env.api.graphql(PEOPLE_QUERY, {"title": titles[0]}))
    edges = answer["data"]["people"]["edges"]
    if not edges or not all(edge["node"]["company"] for edge in edges):
        raise CheckFailed(f"the GraphQL list answered {str(answer)[:300]}")

    async def api(i: int) -> object:
        return await env.api.graphql(PEOPLE_QUERY, {"title": titles[i % len(titles)]})

    async def floor(i: int) -> object:
        async with env.pool.acquire() as connection:
            return await connection.fetch(sql, titles[i % len(titles)])

    name = "GraphQL list 50 people with company"
    one = await _pair(env, 1, api, floor)
    many = await _pair(env, HIGH, api, floor)
    return [row(name, 1, one), row(name, HIGH, many, notes="throughput")]


AGGREGATE_QUERY = """{ opportunitiesAggregate(filter: {stage: {in: [WON, LOST]}}) {
  count sum { amount } avg { amount } min { amount } max { amount } } }"""


async def aggregates(env: Env) -> list[Result]:
    opportunity = env.floor.table("opportunity")
    aggregate_sql = (
        f"SELECT count(*), sum(t.amount), avg(t.amount), min(t.amount), max(t.amount) "
        f'FROM {opportunity} t WHERE t."deletedAt" IS NULL AND t.stage = ANY($1::text[])'
    )
    group_sql = (
        f"SELECT t.stage, count(*), sum(t.amount), sum(t.probability) FROM {opportunity} t "
        f'WHERE t."deletedAt" IS NULL GROUP BY t.stage ORDER BY count(*) DESC, t.stage LIMIT 200'
    )
    answer = orjson.loads(await env.api.graphql(AGGREGATE_QUERY, {}))
    if answer["data"]["opportunitiesAggregate"]["count"] <= 0:
        raise CheckFailed(f"the aggregate answered {answer}")
    groups = orjson.loads(
        await env.api.call("GET", "/rest/opportunities/groupBy", params=[("field", "stage")])
    )["data"]
    if not groups or "count" not in groups[0]:
        raise CheckFailed(f"groupBy answered {groups}")

    async def api_aggregate(i: int) -> object:
        return await env.api.graphql(AGGREGATE_QUERY, {})

    async def floor_aggregate(i: int) -> object:
        return await env.pool.fetchrow(aggregate_sql, ["WON", "LOST"])

    async def api_group(i: int) -> object:
        return await env.api.call("GET", "/rest/opportunities/groupBy", params=[("field", "stage")])

    async def floor_group(i: int) -> object:
        return await env.pool.fetch(group_sql)

    count = max(1, env.plan.requests // 4)
    aggregate = await _pair(env, 1, api_aggregate, floor_aggregate, requests=count)
    group = await _pair(env, 1, api_group, floor_group, requests=count)
    size = len(env.seed.opportunity_ids)
    return [
        row(f"GraphQL aggregate over {size} opportunities", 1, aggregate),
        row(f"REST groupBy stage over {size} opportunities", 1, group),
    ]


WORKLOADS: tuple[Callable[[Env], Awaitable[list[Result]]], ...] = (
    get_by_id,
    filtered_list,
    relation_filter_list,
    graphql_list,
    aggregates,
    create_one,
    batch,
)


async def run(ctx: BenchContext) -> list[Result]:
    if ctx.seed is None or not ctx.database_url:
        raise RuntimeError(
            "bench_records needs the seeded workspace and DATABASE_URL (bench/run.py)"
        )
    plan = SMOKE if ctx.smoke else FULL
    pool = await asyncpg.create_pool(ctx.database_url, min_size=1, max_size=HIGH)
    connector = aiohttp.TCPConnector(limit=HIGH, force_close=False)
    timeout = aiohttp.ClientTimeout(total=120)
    try:
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
            env = Env(
                ctx, ctx.seed, plan, Api(http, ctx.base_url, ctx.seed), Floor(pool, ctx.seed), pool
            )
            results: list[Result] = []
            for workload in WORKLOADS:
                if ctx.select is not None and workload.__name__ not in ctx.select:
                    continue
                await settle(ctx, timeout=30 if ctx.smoke else 300)
                async with ctx.profile(f"records.{workload.__name__}"):
                    rows = await workload(env)
                for line in rows:
                    print(
                        f"  {line.operation} c={line.concurrency}: "
                        f"{line.requests_per_second:.0f}/s p50 {line.p50_ms:.2f} ms "
                        f"(floor {line.floor_p50_ms or 0:.2f}); "
                        f"cpu ms/request {line.cpu_ms_per_request}",
                        flush=True,
                    )
                results.extend(rows)
            return results
    finally:
        await pool.close()

"""Throughput per core (issue 18): closed-loop load at 16 connections on a workspace of 1,200
people (one in ten an Engineer), the peer harness's data set and workloads, with the CPU each
process of the stack spent per request.

Rows: REST create one person, REST list 20 people filtered on jobTitle, and the same two through
GraphQL. The load is `wrk -t2 -c16` (bench/wrk.py; Debian's `wrk`), or the Python closed loop
(`benchlib.drive`) where wrk is not installed. The CPU split covers every process: gateway,
records, metadata, identity, webhooks, workflows, PostgreSQL with its backends, NATS, Valkey, and
their sum, read from /proc. The event chain runs as in production (outbox relay, webhook intake,
workflow intake, the gateway's feed): each row's CPU window closes only once the events of its
writes are published and consumed (bench/settle.py), so a create pays for its whole chain.

CPU per request is the number budgeted (it moves far less with the machine's load than req/s):
a create at most 1.3x a list's, each GraphQL row at most 1.3x its REST counterpart's. The
ratios to Directus are `make bench-peer` (bench/peer.py).

The rows run interleaved, in rounds (`interleaved`): each round runs every row for a few seconds,
in turn forwards and backwards, and a row's figures are the sum over its rounds. On a shared 2-core
VM the speed drifts by tens of percent over minutes; one long window per row put that drift between
the rows that a budget compares. The lists read one workspace and the creates write another, so the
lists are compared on the same 1,200 people in every round.
"""

from __future__ import annotations

import secrets
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import aiohttp
import orjson

from bench import wrk
from bench.benchlib import BenchContext, Result, TreeCpu, client_session, drive
from bench.seed import signup
from bench.settle import settle

PROFILES_ITSELF = True  # one profile per row

CONNECTIONS = 16
PEOPLE = 1200
ENGINEER_EVERY = 10
CPU_RATIO_BUDGET = 1.3
FULL_SECONDS = 20.0  # per row, over all of its rounds
SMOKE_SECONDS = 1.0
FULL_ROUNDS = 4
SMOKE_ROUNDS = 1

REST_LIST = "/rest/people?limit=20&filter%5BjobTitle%5D%5Beq%5D=Engineer"
REST_CREATE = "/rest/people"
# load.sh's create: a person with a unique email
REST_CREATE_BODY = (
    '{"firstName": "W", "lastName": "K", "jobTitle": "Sales", "email": "' + wrk.UNIQUE + '@ex.com"}'
)
FIELDS = "id firstName lastName email phone jobTitle city companyId createdAt updatedAt"
GRAPHQL_LIST_BODY = orjson.dumps(
    {
        "query": '{ people(first: 20, filter: {jobTitle: {eq: "Engineer"}}) '
        f"{{ edges {{ node {{ {FIELDS} }} }} }} }}"
    }
).decode()
GRAPHQL_CREATE_BODY = orjson.dumps(
    {
        "query": f"mutation($d: PersonCreateInput!) {{ createPerson(data: $d) {{ {FIELDS} }} }}",
        "variables": {
            "d": {"firstName": "W", "lastName": "K", "jobTitle": "Sales", "email": "@ex.com"}
        },
    }
).decode()
GRAPHQL_CREATE_BODY = GRAPHQL_CREATE_BODY.replace('"@ex.com"', f'"{wrk.UNIQUE}@ex.com"')

CREATE_KEY = """mutation { createApiKey(input: {name: "throughput",
  expiresAt: "2099-01-01T00:00:00Z"}) { token } }"""


class CheckFailed(RuntimeError):
    """An answer did not have the expected status or shape."""


@dataclass(frozen=True)
class Workload:
    key: str  # for --select
    name: str
    path: str
    body: str | None
    expect: int
    check: Callable[[bytes], bool]  # the shape of one answer, checked before measuring


def _rest_list_ok(data: bytes) -> bool:
    rows = orjson.loads(data)["data"]
    return len(rows) == 20 and all(row["jobTitle"] == "Engineer" for row in rows)


def _graphql_list_ok(data: bytes) -> bool:
    edges = orjson.loads(data).get("data", {}).get("people", {}).get("edges", [])
    return len(edges) == 20 and all(edge["node"]["jobTitle"] == "Engineer" for edge in edges)


def _rest_create_ok(data: bytes) -> bool:
    return bool(orjson.loads(data)["data"].get("id"))


def _graphql_create_ok(data: bytes) -> bool:
    return bool((orjson.loads(data).get("data") or {}).get("createPerson", {}).get("id"))


REST_LIST_ROW = Workload(
    "rest_list", "REST list 20 people, filtered", REST_LIST, None, 200, _rest_list_ok
)
REST_CREATE_ROW = Workload(
    "rest_create", "REST create person", REST_CREATE, REST_CREATE_BODY, 201, _rest_create_ok
)
GRAPHQL_LIST_ROW = Workload(
    "graphql_list",
    "GraphQL list 20 people, filtered",
    "/graphql",
    GRAPHQL_LIST_BODY,
    200,
    _graphql_list_ok,
)
GRAPHQL_CREATE_ROW = Workload(
    "graphql_create",
    "GraphQL create person",
    "/graphql",
    GRAPHQL_CREATE_BODY,
    200,
    _graphql_create_ok,
)


def people(count: int = PEOPLE) -> list[dict[str, str]]:
    """The peer harness's data set: F<i> L<i>, p<i>@ex.com, one in ten an Engineer."""
    return [
        {
            "firstName": f"F{i}",
            "lastName": f"L{i}",
            "email": f"p{i}@ex.com",
            "jobTitle": "Engineer" if i % ENGINEER_EVERY == 0 else "Sales",
        }
        for i in range(count)
    ]


async def prepare(base_url: str, count: int = PEOPLE) -> str:
    """A new workspace with `count` people; answers an API key of it."""
    async with client_session(base_url) as http:
        account = await signup(http, base_url, "Throughput")
        headers = {"Authorization": f"Bearer {account['accessToken']}"}
        async with http.post("/graphql", json={"query": CREATE_KEY}, headers=headers) as response:
            body = orjson.loads(await response.read())
        if body.get("errors"):
            raise RuntimeError(f"createApiKey failed: {body['errors']}")
        key: str = body["data"]["createApiKey"]["token"]
        rows = people(count)
        for start in range(0, len(rows), 1000):
            async with http.post(
                "/rest/batch/people",
                data=orjson.dumps(rows[start : start + 1000]),
                headers={**headers, "Content-Type": "application/json"},
            ) as response:
                if response.status != 201:
                    raise RuntimeError(f"seeding people failed: {response.status}")
    return key


def _body(workload: Workload, unique: str) -> bytes | None:
    if workload.body is None:
        return None
    return workload.body.replace(wrk.UNIQUE, unique).encode()


async def request_once(
    http: aiohttp.ClientSession, key: str, workload: Workload, unique: str
) -> bytes:
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    body = _body(workload, unique)
    method = "GET" if body is None else "POST"
    async with http.request(method, workload.path, data=body, headers=headers) as response:
        data = await response.read()
        if response.status != workload.expect:
            raise CheckFailed(f"{workload.name}: {response.status} {data[:300]!r}")
        return data


@dataclass(frozen=True)
class Load:
    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float
    errors: int
    client: str


async def _load(base_url: str, key: str, workload: Workload, seconds: float) -> Load:
    if wrk.available():
        request = wrk.Request(workload.path, key, workload.body)
        run = await wrk.run(base_url, request, connections=CONNECTIONS, seconds=seconds)
        return Load(
            run.requests,
            run.seconds,
            run.p50_ms,
            run.p99_ms,
            run.non2xx + run.socket_errors,
            f"wrk -t{wrk.THREADS} -c{CONNECTIONS}",
        )
    tag = secrets.token_hex(4)
    async with client_session(base_url, CONNECTIONS) as http:

        async def call(i: int) -> object:
            return await request_once(http, key, workload, f"d{tag}.{i}")

        samples = await drive(call, concurrency=CONNECTIONS, requests=10**9, max_seconds=seconds)
    return Load(
        samples.count + samples.errors,
        samples.seconds,
        samples.p(50),
        samples.p(99),
        samples.errors,
        "Python closed loop (wrk is not installed)",
    )


async def measure(ctx: BenchContext, key: str, workload: Workload, seconds: float) -> Result:
    """One row: the answer's shape checked, then the load, then the event chain drained, with
    the CPU of every process over all of it."""
    async with client_session(ctx.base_url) as http:
        answer = await request_once(http, key, workload, f"check{secrets.token_hex(4)}")
    if not workload.check(answer):
        raise CheckFailed(f"{workload.name} answered {answer[:300]!r}")
    await settle(ctx, timeout=30 if ctx.smoke else 300)
    meter = TreeCpu(ctx.process_pids)
    meter.start()
    load = await _load(ctx.base_url, key, workload, seconds)
    drained = time.monotonic()
    await settle(ctx, timeout=30 if ctx.smoke else 300)
    drain = time.monotonic() - drained
    cpu = meter.per_request(load.requests)
    return Result(
        operation=workload.name,
        concurrency=CONNECTIONS,
        requests=load.requests,
        seconds=load.seconds,
        p50_ms=load.p50_ms,
        p99_ms=load.p99_ms,
        errors=load.errors,
        notes=f"{load.client}; events drained {drain:.1f} s after"
        + (f"; {load.errors} failed requests" if load.errors else ""),
        cpu_ms_per_request=cpu,
        budget="" if "total" not in cpu else f"cpu {cpu['total']:.2f} ms/request",
    )


def judge(rows: dict[str, Result]) -> None:
    """The CPU budgets between rows: a create at most 1.3x a list, GraphQL at most 1.3x REST."""
    pairs = (
        (REST_CREATE_ROW.name, REST_LIST_ROW.name, "REST list"),
        (GRAPHQL_LIST_ROW.name, REST_LIST_ROW.name, "REST list"),
        (GRAPHQL_CREATE_ROW.name, REST_CREATE_ROW.name, "REST create"),
    )
    for name, base_name, label in pairs:
        row, base = rows.get(name), rows.get(base_name)
        if row is None or base is None:
            continue
        mine = row.cpu_ms_per_request.get("total", 0.0)
        theirs = base.cpu_ms_per_request.get("total", 0.0)
        ratio = mine / theirs if theirs else float("inf")
        row.budget = f"cpu {mine:.2f} = {ratio:.2f}x {label} <= {CPU_RATIO_BUDGET}x"
        row.passed = row.errors == 0 and row.requests > 0 and ratio <= CPU_RATIO_BUDGET


ROWS = (REST_LIST_ROW, GRAPHQL_LIST_ROW, REST_CREATE_ROW, GRAPHQL_CREATE_ROW)
WRITES = frozenset({REST_CREATE_ROW.key, GRAPHQL_CREATE_ROW.key})


@dataclass(frozen=True)
class Keys:
    """An API key of the workspace the lists read, and one of the workspace the creates grow.
    After a create round the creates' table holds thousands more people and autovacuum analyzes
    it; the lists' table stays as seeded (one table read 1.20 ms of PostgreSQL CPU per list
    against 0.40 before this split)."""

    reads: str
    writes: str

    def for_row(self, workload: Workload) -> str:
        return self.writes if workload.key in WRITES else self.reads


async def prepare_keys(base_url: str) -> Keys:
    return Keys(reads=await prepare(base_url), writes=await prepare(base_url))


def merged(name: str, rounds: Sequence[Result]) -> Result:
    """One row from its rounds: requests, seconds and CPU summed; p50 and p99 the median of the
    rounds'; each round's CPU total in the notes, so the drift is seen."""
    requests = sum(r.requests for r in rounds)
    parts = dict.fromkeys(part for r in rounds for part in r.cpu_ms_per_request)  # in order
    spent = {
        part: sum(r.cpu_ms_per_request.get(part, 0.0) * r.requests for r in rounds)
        for part in parts
    }
    cpu = {part: round(ms / requests, 3) if requests else 0.0 for part, ms in spent.items()}
    totals = ", ".join(f"{r.cpu_ms_per_request.get('total', 0.0):.2f}" for r in rounds)
    first = rounds[0]
    return Result(
        operation=name,
        concurrency=first.concurrency,
        requests=requests,
        seconds=sum(r.seconds for r in rounds),
        p50_ms=statistics.median(r.p50_ms for r in rounds),
        p99_ms=statistics.median(r.p99_ms for r in rounds),
        errors=sum(r.errors for r in rounds),
        notes=f"{first.notes.split(';')[0]}; {len(rounds)} rounds, cpu ms/request {totals}",
        cpu_ms_per_request=cpu,
        budget="" if "total" not in cpu else f"cpu {cpu['total']:.2f} ms/request",
    )


@dataclass(frozen=True)
class Row:
    """A row measured in rounds: `measure(seconds, round)` runs its load once."""

    key: str
    name: str
    measure: Callable[[float, int], Awaitable[Result]]


async def interleaved(
    rows: Sequence[Row], seconds: float, rounds: int, warmup: float = 0.0
) -> tuple[dict[str, Result], dict[str, list[Result]]]:
    """Every row `rounds` times, `seconds` in all per row, in rounds that run each row once, in
    the given order and then reversed: on a shared VM the speed drifts by tens of percent over
    minutes, and rows compared by a budget must meet the same drift. With `warmup`, each row
    first runs that long unmeasured (a JIT, caches, a connection pool's growth). Answers the
    merged rows by key, in the order given, and each row's rounds."""
    if warmup > 0:
        for row in rows:
            result = await row.measure(warmup, 0)
            print(
                f"  warm-up {row.name}: {result.requests_per_second:.0f}/s (not counted)",
                flush=True,
            )
    measured: dict[str, list[Result]] = {row.key: [] for row in rows}
    for number in range(1, rounds + 1):
        for row in rows if number % 2 else list(reversed(rows)):
            result = await row.measure(seconds / rounds, number)
            measured[row.key].append(result)
            print(
                f"  round {number}/{rounds} {row.name}: {result.requests_per_second:.0f}/s, "
                f"cpu ms/request {result.cpu_ms_per_request}",
                flush=True,
            )
    return {row.key: merged(row.name, measured[row.key]) for row in rows}, measured


def project_rows(ctx: BenchContext, keys: Keys, workloads: Sequence[Workload]) -> list[Row]:
    """The project's workloads as rows of `interleaved`, each round profiled on its own."""

    def row(workload: Workload) -> Row:
        async def measure_once(seconds: float, number: int) -> Result:
            async with ctx.profile(f"throughput.{workload.key}.{number}"):
                return await measure(ctx, keys.for_row(workload), workload, seconds)

        return Row(workload.key, workload.name, measure_once)

    return [row(workload) for workload in workloads]


async def run(ctx: BenchContext) -> list[Result]:
    seconds = SMOKE_SECONDS if ctx.smoke else FULL_SECONDS
    rounds = SMOKE_ROUNDS if ctx.smoke else FULL_ROUNDS
    print(f"  two workspaces of {PEOPLE} people: one for the lists, one for creates", flush=True)
    keys = await prepare_keys(ctx.base_url)
    chosen = [w for w in ROWS if ctx.select is None or w.key in ctx.select]
    measured, _ = await interleaved(project_rows(ctx, keys, chosen), seconds, rounds)
    rows = {result.operation: result for result in measured.values()}
    for row in rows.values():
        print(
            f"  {row.operation} c={CONNECTIONS}: {row.requests_per_second:.0f}/s "
            f"p50 {row.p50_ms:.2f} ms; cpu ms/request {row.cpu_ms_per_request}",
            flush=True,
        )
    judge(rows)
    return list(rows.values())

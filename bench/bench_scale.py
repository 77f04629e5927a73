"""`make bench-scale`: costs as a stack grows in tenants and rows (issue #27's table).

Starts a stack of its own (durable PostgreSQL, like `make bench`), measures every row of the
table at a small point (10 workspaces, one of them with 10,000 people), grows the stack to
`--workspaces` workspaces (sign-ups through the API) and the big workspace to `--rows` people
(seeded through `POST /rest/batch/people`, 1,000 per call, a few writers: seeding, not a
measurement), measures again and prints each row with both figures, the ratio and its budget.
CPU is read from /proc (psutil) per process: the services and PostgreSQL with its backends.

    make bench-scale                                   # 1,000 workspaces, 1,000,000 rows
    make bench-scale SCALE_ARGS="--workspaces 50 --rows 50000"

A full run takes long (sign-ups hash passwords with argon2id; a million rows to seed and
index) and its figures mean something only on a quiet machine. Timings are never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import orjson
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from bench.bench_relay import listened_workspace
from bench.benchlib import BenchContext, cpu_seconds, percentile
from bench.seed import signup
from bench.settle import settle
from crmstack.stack import Stack, StackConfig
from records.sql import workspace_schema_name

BATCH = 1000
WRITERS = 3
SIGNUP_CONCURRENCY = 4
REPEAT = 5
PAIR_REPEAT = 15
IDLE_SECONDS = 60  # CPU times tick every 10 ms: 0.17 ms/s a tick over 60 s
POSITIONS = (0.0, 0.37, 0.5, 0.94)
PROCESSES = ("gateway", "identity", "metadata", "records", "webhooks", "workflows")


@dataclass
class Point:
    workspaces: int
    rows: int
    figures: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Row:
    key: str
    label: str
    budget: float | None  # largest allowed ratio of the grown figure to the small one
    budget_text: str


class Bench:
    def __init__(self, stack: Stack, http: aiohttp.ClientSession) -> None:
        self.stack = stack
        self.http = http
        self.base = stack.base_url
        self.headers: dict[str, str] = {}
        self.workspace_id = ""
        self.workspaces = 0
        self.rows = 0
        self.person_object = ""
        self.last_drain_seconds = 0.0

    # -- calls ----------------------------------------------------------------------------------
    async def call(self, method: str, path: str, body: Any = None, status: int = 200) -> Any:
        async with self.http.request(
            method,
            self.base + path,
            data=None if body is None else orjson.dumps(body),
            headers={**self.headers, "Content-Type": "application/json"},
        ) as response:
            payload = await response.read()
            if response.status != status:
                raise RuntimeError(f"{method} {path}: {response.status} {payload[:300]!r}")
            return orjson.loads(payload) if payload else None

    async def graphql(self, query: str, variables: dict[str, Any] | None = None) -> Any:
        body = await self.call("POST", "/graphql", {"query": query, "variables": variables or {}})
        if body.get("errors"):
            raise RuntimeError(f"graphql: {body['errors']}")
        return body["data"]

    async def timed(self, make: Callable[[], Awaitable[Any]], repeat: int = REPEAT) -> float:
        """p50 in ms of `repeat` sequential calls (concurrency 1)."""
        samples = []
        for _ in range(repeat):
            started = time.perf_counter()
            await make()
            samples.append((time.perf_counter() - started) * 1000)
        return round(percentile(sorted(samples), 50), 2)

    async def timed_pair(
        self,
        first: Callable[[], Awaitable[Any]],
        second: Callable[[], Awaitable[Any]],
        repeat: int = PAIR_REPEAT,
    ) -> tuple[float, float]:
        """p50 in ms of each of two calls made in turn, `repeat` times each (concurrency 1).

        For a budget that is the ratio of the two: the machine's drift, and the slower first
        calls after other work, fall on both alike. Run one after the other, 5 calls each, the
        list with totalCount read 1.56x to 2.8x the list between runs of the same code; 40
        calls each in turn read 1.05-1.5 ms between them every time.
        """
        samples: tuple[list[float], list[float]] = ([], [])
        for _ in range(repeat):
            for make, taken in ((first, samples[0]), (second, samples[1])):
                started = time.perf_counter()
                await make()
                taken.append((time.perf_counter() - started) * 1000)
        return (
            round(percentile(sorted(samples[0]), 50), 2),
            round(percentile(sorted(samples[1]), 50), 2),
        )

    # -- growth (seeding) ----------------------------------------------------------------------
    async def grow_workspaces(self, total: int) -> None:
        missing = total - self.workspaces
        done = 0

        async def one() -> None:
            nonlocal done
            while True:
                async with lock:
                    if done >= missing:
                        return
                    done += 1
                    number = self.workspaces + done
                await signup(self.http, self.base, f"Scale {number}")

        lock = asyncio.Lock()
        started = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(SIGNUP_CONCURRENCY)))
        self.workspaces = total
        seconds = time.perf_counter() - started
        print(f"  {total} workspaces ({missing} signed up in {seconds:.0f} s)", flush=True)

    async def write_people(self, first: int, end: int) -> None:
        queue = list(range(first, end, BATCH))

        async def writer() -> None:
            while queue:
                start = queue.pop(0)
                rows = [person(i) for i in range(start, min(start + BATCH, end))]
                await self.call("POST", "/rest/batch/people", rows, status=201)

        await asyncio.gather(*(writer() for _ in range(WRITERS)))

    async def grow_rows(self, total: int) -> None:
        started = time.perf_counter()
        await self.write_people(self.rows, total)
        loaded = time.perf_counter()
        rate = (total - self.rows) / max(loaded - started, 1e-6)
        print(
            f"  {total:,} people ({total - self.rows:,} written at {rate:,.0f} rows/s)", flush=True
        )
        self.rows = total
        await wait_outbox_drained(self.stack)
        self.last_drain_seconds = time.perf_counter() - loaded
        await analyze(self.stack, self.workspace_id)

    # -- measurements ---------------------------------------------------------------------------
    async def measure(self, point: Point) -> None:
        f = point.figures
        # Every event consumed too, not only published: after the relay drained a 1,000,000-row
        # load, the webhooks and workflows consumers still read its events, counted as their
        # idle CPU (43.8 and 55.5 ms/s against 2.8 and 3.0 at 10,000 rows).
        events = BenchContext(
            base_url=self.base,
            smoke=False,
            database_url=self.stack.env["DATABASE_URL"],
            nats_url=self.stack.env["NATS_URL"],
        )
        await settle(events, timeout=600)
        await asyncio.sleep(5)  # let the growth settle (reconciler announcements)
        for name, value in (await idle_cpu(self.stack, IDLE_SECONDS)).items():
            f[f"idle:{name}"] = value
        f["createField"] = await self.timed(self.create_field, 3)
        for descending in (False, True):
            for position in POSITIONS:
                cursor = await self.cursor_at(position, descending)
                order = "DESC" if descending else "ASC"
                path = f"/rest/people?orderBy[lastName]={order}&limit=50&fields=lastName"
                if cursor:
                    path += f"&after={cursor}"
                f[f"cursor:{order}:{position}"] = await self.timed(
                    functools.partial(self.call, "GET", path)
                )
        probe = f"person{self.rows // 2}@"
        f["contains"] = await self.timed(
            lambda: self.call("GET", f"/rest/people?filter[email][contains]={probe}&limit=50")
        )
        f["groupBy"] = await self.timed(
            lambda: self.call("GET", "/rest/people/groupBy?field=jobTitle"), 3
        )
        f["aggregateCount"] = await self.timed(
            lambda: self.graphql("{ peopleAggregate { count } }"), 3
        )
        f["list"], f["listTotalCount"] = await self.timed_pair(
            lambda: self.graphql("{ people(first: 50) { edges { node { id } } } }"),
            lambda: self.graphql("{ people(first: 50) { totalCount edges { node { id } } } }"),
        )
        batch = [person(self.rows + i) for i in range(BATCH)]
        f["batch1000"] = await self.timed(
            lambda: self.call("POST", "/rest/batch/people", batch, status=201), 3
        )
        self.rows += 3 * BATCH
        await wait_outbox_drained(self.stack)
        f["drainSeconds"] = round(self.last_drain_seconds, 1)
        f["relayEventsPerSecond"] = await self.relay_rate(
            min(max(point.rows // 10, 10_000), 100_000)
        )
        searchable = await self.create_searchable_field()  # last: it may lock the table long
        if searchable is not None:
            f["createSearchableField"] = searchable

    async def relay_rate(self, count: int) -> float:
        """Events/s the relay publishes from a backlog: `count` rows written while NATS is
        stopped, then NATS started; timed from the first event published to the last."""
        self.stack.stop_infra("nats")
        try:
            await self.write_people(self.rows, self.rows + count)
            self.rows += count
        finally:
            self.stack.start_infra("nats")
        start_count = published_total(self.stack)
        deadline = time.monotonic() + 300
        while (first := published_total(self.stack)) == start_count:
            if time.monotonic() > deadline:
                raise RuntimeError("the relay published nothing after NATS came back")
            await asyncio.sleep(0.1)
        started = time.perf_counter()
        while (last := published_total(self.stack)) < start_count + count:
            if time.monotonic() > deadline:
                raise RuntimeError("the relay did not drain its backlog in 5 minutes")
            await asyncio.sleep(0.05)
        seconds = time.perf_counter() - started
        return round((last - first) / max(seconds, 1e-6))

    async def create_field(self, searchable: bool = False) -> None:
        name = "bench" + secrets.token_hex(4)
        await self.graphql(
            "mutation($o: UUID!, $n: String!, $s: Boolean!) { createField(input: "
            "{objectMetadataId: $o, name: $n, label: $n, type: TEXT, isSearchable: $s}) { id } }",
            {"o": self.person_object, "n": name, "s": searchable},
        )

    async def create_searchable_field(self) -> float | None:
        """ms of one createField whose field search matches (the search column is generated,
        so PostgreSQL rewrites the table and builds its search index again), None if it fails."""
        started = time.perf_counter()
        try:
            await self.create_field(searchable=True)
        except RuntimeError as exc:
            print(f"  createField of a searchable field failed: {exc}", flush=True)
            return None
        return round((time.perf_counter() - started) * 1000, 1)

    async def cursor_at(self, position: float, descending: bool) -> str:
        """The cursor of the record at `position` of the order (found in SQL: not timed)."""
        if position == 0:
            return ""
        direction = "DESC" if descending else "ASC"
        connection = await asyncpg.connect(self.stack.env["DATABASE_URL"])
        try:
            table = f'{workspace_schema_name(self.workspace_id)}."person"'
            count = await connection.fetchval(
                f'SELECT count(*) FROM {table} WHERE "deletedAt" IS NULL'
            )
            record_id = await connection.fetchval(
                f'SELECT id::text FROM {table} WHERE "deletedAt" IS NULL '
                f'ORDER BY "lastName" {direction}, id {direction} OFFSET $1 LIMIT 1',
                int(count * position),
            )
        finally:
            await connection.close()
        page = await self.call(
            "GET", f"/rest/people?orderBy[lastName]={direction}&filter[id][eq]={record_id}&limit=1"
        )
        cursor: str = page["pageInfo"]["endCursor"]
        return cursor


def person(i: int) -> dict[str, Any]:
    return {
        "firstName": f"First{i % 311}",
        "lastName": None if i % 5 == 0 else f"Last{i % 9973:05d}",  # nullable, many ties
        "email": f"person{i}@example.com",
        "jobTitle": ("CEO", "CTO", "Engineer", "Sales", "Support")[i % 5],
    }


# -- the stack from outside -----------------------------------------------------------------------
def processes(stack: Stack) -> dict[str, list[psutil.Process]]:
    found: dict[str, list[psutil.Process]] = {}
    for name in PROCESSES:
        for instance in stack.instances.get(name, []):
            if instance.process.pid:
                found.setdefault(name, []).append(psutil.Process(instance.process.pid))
    assert stack.infra is not None
    postgres = stack.infra.servers["postgres"].process.pid
    if postgres:
        root = psutil.Process(postgres)
        found["postgres"] = [root, *root.children(recursive=True)]
    return found


async def idle_cpu(stack: Stack, seconds: float) -> dict[str, float]:
    """CPU milliseconds per second of each process while nothing calls the stack; prints
    PostgreSQL's by kind of process (`postgres_roles`)."""
    found = processes(stack)
    before = {name: _each(procs) for name, procs in found.items()}
    roles_before = postgres_roles(found.get("postgres", []))
    await asyncio.sleep(seconds)
    after = {name: _each(procs) for name, procs in found.items()}
    roles_after = postgres_roles(found.get("postgres", []))
    by_role = ", ".join(
        f"{role} {(roles_after[role] - roles_before.get(role, 0.0)) * 1000 / seconds:.2f}"
        for role in sorted(roles_after)
    )
    print(f"  postgres idle CPU by process (ms/s): {by_role}", flush=True)
    spent = {
        name: sum(used - before[name][pid] for pid, used in now.items() if pid in before[name])
        for name, now in after.items()
    }
    return {name: round(value * 1000 / seconds, 2) for name, value in spent.items()}


def _each(processes: list[psutil.Process]) -> dict[int, float]:
    """CPU seconds of each process still running: one that ends in the window (a PostgreSQL
    backend) counts nothing, rather than minus what it had used (idle CPU of PostgreSQL read
    -7.5 ms/s once)."""
    used: dict[int, float] = {}
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        used[process.pid] = times.user + times.system
    return used


def postgres_roles(postgres: list[psutil.Process]) -> dict[str, float]:
    """CPU seconds of PostgreSQL's processes by kind: `postmaster`, a background process
    (`checkpointer`, `autovacuum launcher`, ...) or `backends` (client connections)."""
    roles: dict[str, float] = {}
    for index, process in enumerate(postgres):
        try:
            title = " ".join(process.cmdline())
        except psutil.Error:
            continue
        role = "postmaster" if index == 0 else title.removeprefix("postgres: ").strip()
        if index and ("(" in title or "[local]" in title):
            role = "backends"  # "postgres: <user> <db> 127.0.0.1(<port>) idle"
        elif role.startswith("autovacuum worker"):
            role = "autovacuum worker"
        roles[role] = roles.get(role, 0.0) + cpu_seconds([process])
    return roles


def metric(stack: Stack, name: str) -> float:
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    port = stack.instances["records"][0].metrics_port
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    )


def published_total(stack: Stack) -> float:
    return metric(stack, "records_outbox_published_total")


async def wait_outbox_drained(stack: Stack, timeout: float = 1800) -> None:
    deadline = time.monotonic() + timeout
    await asyncio.sleep(2)  # the gauge is refreshed every second
    while metric(stack, "records_outbox_pending") > 0:
        if time.monotonic() > deadline:
            raise RuntimeError("the outbox did not drain")
        await asyncio.sleep(0.5)


async def analyze(stack: Stack, workspace_id: str) -> None:
    """What autovacuum does after a bulk load (see bench/seed.py), done before measuring, so
    that the idle rows measure the idle stack rather than autovacuum's work on the tables the
    load filled (at 1,000,000 rows it doubled PostgreSQL's idle CPU); then waits (at most
    5 minutes) for autovacuum workers that had already started, and runs a checkpoint, so the
    checkpointer's writing of the load's pages is not counted either."""
    connection = await asyncpg.connect(stack.env["DATABASE_URL"])
    try:
        for table in (
            f'{workspace_schema_name(workspace_id)}."person"',
            "records.record_history",
            "records.outbox",
        ):
            await connection.execute(f"VACUUM (ANALYZE) {table}")
        deadline = time.monotonic() + 300
        while await connection.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'"
        ):
            if time.monotonic() > deadline:
                print("  autovacuum still busy after 5 minutes; measuring anyway", flush=True)
                break
            await asyncio.sleep(1)
        # The load's dirty pages are written by the checkpointer over the next minutes: flushed
        # now, they are not counted as the idle stack's work.
        await connection.execute("CHECKPOINT")
    finally:
        await connection.close()


# -- the table ----------------------------------------------------------------------------------
def rows() -> list[Row]:
    table = [
        Row(f"idle:{name}", f"idle CPU {name} (ms/s)", 1.5, "<= 1.5x")
        for name in (*PROCESSES, "postgres")
    ]
    table.append(Row("createField", "createField p50, TEXT not searchable (ms)", 1.3, "<= 1.3x"))
    for order in ("ASC", "DESC"):
        for position in POSITIONS:
            label = f"cursor page lastName {order} at {position:.0%} (ms)"
            table.append(Row(f"cursor:{order}:{position}", label, None, "<= 3x the first page"))
    table += [
        Row("contains", "filter[email][contains], one match (ms)", None, "p50 <= 50 ms"),
        Row("groupBy", "groupBy jobTitle (ms)", None, "exact, documented cost"),
        Row("aggregateCount", "aggregate count (ms)", None, "exact, documented cost"),
        Row("list", "list, first 50 (ms)", None, "-"),
        Row("listTotalCount", "list with totalCount (ms)", None, "<= 2x the list"),
        Row("batch1000", "batch insert of 1,000 rows (ms)", 1.3, "<= 1.3x"),
        Row("relayEventsPerSecond", "relay events/s from a backlog", None, ">= 10,000/s"),
        Row("drainSeconds", "backlog drain after the load (s)", None, "<= 120 s"),
        Row(
            "createSearchableField",
            "createField, searchable TEXT, one call (ms; - = failed)",
            None,
            "information",
        ),
    ]
    return table


def verdict(row: Row, small: Point, big: Point) -> str:
    a, b = small.figures.get(row.key), big.figures.get(row.key)
    if a is None or b is None:
        return "-"
    if row.budget is not None:
        return "pass" if b <= max(a * row.budget, a + 1.0) else "FAIL"  # 1 ms (or ms/s) slack
    if row.key.startswith("cursor:"):
        first = big.figures[row.key.rsplit(":", 1)[0] + ":0.0"]
        return "pass" if b <= 3 * first else "FAIL"
    if row.key == "contains":
        return "pass" if b <= 50 else "FAIL"
    if row.key == "listTotalCount":
        return "pass" if b <= 2 * big.figures["list"] else "FAIL"
    if row.key == "relayEventsPerSecond":
        return "pass" if b >= 10_000 else "FAIL"
    if row.key == "drainSeconds":
        return "pass" if b <= 120 else "FAIL"
    return "-"


def render(small: Point, big: Point) -> str:
    head = (
        f"| What | {small.workspaces} ws / {small.rows:,} rows | "
        f"{big.workspaces} ws / {big.rows:,} rows | ratio | budget | verdict |"
    )
    lines = [head, "|---|---|---|---|---|---|"]
    for row in rows():
        a, b = small.figures.get(row.key), big.figures.get(row.key)
        ratio = f"{b / a:.2f}" if a and b is not None else "-"
        lines.append(
            f"| {row.label} | {a if a is not None else '-'} | {b if b is not None else '-'} | "
            f"{ratio} | {row.budget_text} | {verdict(row, small, big)} |"
        )
    return "\n".join(lines)


async def run(stack: Stack, workspaces: int, total_rows: int) -> str:
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        bench = Bench(stack, http)
        account = await signup(http, bench.base, "Scale: the big workspace")
        bench.headers = {"Authorization": f"Bearer {account['accessToken']}"}
        bench.workspace_id = account["workspace"]["id"]
        bench.workspaces = 1
        # Its events are listened to, so the relay publishes them (the drain and relay rows
        # measure publishing, not skipping) and every consumer receives them.
        connection = await asyncpg.connect(stack.env["DATABASE_URL"])
        try:
            await listened_workspace(connection, bench.workspace_id)
        finally:
            await connection.close()
        objects = await bench.graphql(
            "{ objects(first: 100) { edges { node { id nameSingular } } } }"
        )
        bench.person_object = next(
            edge["node"]["id"]
            for edge in objects["objects"]["edges"]
            if edge["node"]["nameSingular"] == "person"
        )
        small = Point(10, 10_000)
        print(
            f"growing to the small point: {small.workspaces} workspaces, {small.rows:,} rows",
            flush=True,
        )
        await bench.grow_workspaces(small.workspaces)
        await bench.grow_rows(small.rows)
        await bench.measure(small)
        big = Point(workspaces, total_rows)
        print(f"growing to {workspaces} workspaces and {total_rows:,} rows", flush=True)
        await bench.grow_workspaces(workspaces)
        await bench.grow_rows(total_rows)
        big.rows = bench.rows
        await bench.measure(big)
        small.rows = min(small.rows, total_rows)
    return render(small, big)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workspaces", type=int, default=1000)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--fast", action="store_true", help="PostgreSQL without fsync")
    args = parser.parse_args()
    if args.workspaces < 10 or args.rows < 10_000:
        parser.error("grow to at least 10 workspaces and 10,000 rows (the small point)")
    data_dir = Path(tempfile.mkdtemp(prefix="crm-bench-scale-"))
    stack = Stack(
        StackConfig(
            data_dir=data_dir,
            app_secret=secrets.token_urlsafe(48),
            extra_env={
                "LOG_LEVEL": "WARNING",
                "API_RATE_LIMITING_LIMIT": "100000000",
                # The workspaces are sign-ups from one address, beyond the per-IP default (100).
                "SIGNUP_MAX_PER_IP": str(args.workspaces + 10),
                "SIGNUP_MAX_TOTAL": str(args.workspaces + 10),
            },
            fast_postgres=args.fast,
        )
    )
    stack.start()
    try:
        table = asyncio.run(run(stack, args.workspaces, args.rows))
    finally:
        stack.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
    print(table, flush=True)


if __name__ == "__main__":
    main()

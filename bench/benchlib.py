"""What every benchmark in bench/ shares: the context, the result row, the load driver,
percentiles, the table and JSON output.

A benchmark module exposes `async def run(ctx: BenchContext) -> list[Result]`; `make bench`
(and `make bench-smoke`, which `make test` runs) collects every module's rows into one table and
`bench/results/latest.json` (see bench/README.md for the contract). Budgets are stated in each
module, beside the number they bound, and never asserted in tests.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson
import psutil

if TYPE_CHECKING:
    from crmstack.stack import Stack


@dataclass
class Seed:
    """The seeded workspace (`bench/seed.py`): who to call it as and what is in it."""

    token: str  # a bearer access token of the workspace's admin
    workspace_id: str
    schema: str  # the workspace's Postgres schema (ws_<hex>)
    company_ids: list[str]
    person_ids: list[str]
    opportunity_ids: list[str]
    job_titles: list[str]  # values of person.jobTitle (filters select about one in len())
    company_names: list[str]

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


@asynccontextmanager
async def no_profile(workload: str) -> AsyncIterator[None]:
    yield


@dataclass
class BenchContext:
    base_url: str
    smoke: bool  # seconds-long run that proves the code works; numbers are not meaningful
    database_url: str = ""
    redis_url: str = ""
    nats_url: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    seed: Seed | None = None  # the shared data set, when the runner seeded one
    # Starts one more gateway on the running stack with extra settings and answers its base
    # URL (the runner stops it at the end); None when the stack is not local.
    start_gateway: Callable[[dict[str, str]], Awaitable[str]] | None = None
    # `async with ctx.profile("name"):` samples the services while the block runs (--profile).
    profile: Callable[[str], AbstractAsyncContextManager[None]] = no_profile
    select: set[str] | None = None  # sub-workloads to run (--select); None: all
    service_pids: dict[str, int] = field(default_factory=dict)  # e.g. {"gateway": 1234}
    # Every process of the stack by part, services and infrastructure, each with its children
    # counted (PostgreSQL's backends): {"gateway": [pid, ...], "postgres": [postmaster], ...}.
    process_pids: dict[str, list[int]] = field(default_factory=dict)


@dataclass
class Result:
    operation: str
    concurrency: int
    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float
    floor_p50_ms: float | None = None  # the same operation done directly (asyncpg), if any
    budget: str = ""
    passed: bool | None = None  # None when there is no budget
    notes: str = ""
    floor_requests_per_second: float | None = None
    floor_p99_ms: float | None = None
    errors: int = 0
    module: str = ""  # set by the runner: the workload module that produced the row
    # CPU time each service spent per request during the run (user + system, all threads):
    # unlike latency it hardly depends on what else the machine is doing.
    cpu_ms_per_request: dict[str, float] = field(default_factory=dict)

    @property
    def requests_per_second(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0

    @property
    def ratio_to_floor(self) -> float | None:
        if self.floor_p50_ms is None or self.floor_p50_ms <= 0:
            return None
        return self.p50_ms / self.floor_p50_ms

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["requests_per_second"] = round(self.requests_per_second, 1)
        ratio = self.ratio_to_floor
        data["ratio_to_floor"] = None if ratio is None else round(ratio, 2)
        return data


@dataclass
class Samples:
    """What one driven run measured: per-request latencies, wall time, failures."""

    latencies_ms: list[float]
    seconds: float
    errors: int = 0
    first_error: str = ""
    statuses: Counter[int] = field(default_factory=Counter)

    @property
    def count(self) -> int:
        return len(self.latencies_ms)

    @property
    def rate(self) -> float:
        return self.count / self.seconds if self.seconds > 0 else 0.0

    def p(self, q: float) -> float:
        return percentile(sorted(self.latencies_ms), q)


async def drive(
    operation: Callable[[int], Awaitable[object]],
    *,
    concurrency: int,
    requests: int,
    max_seconds: float,
    warmup: int = 0,
) -> Samples:
    """Closed loop: `concurrency` workers call `operation(i)` until `requests` calls are done or
    `max_seconds` have passed. A call that raises counts as an error (no latency sample)."""
    for index in range(warmup):
        await operation(-1 - index)
    next_index = 0
    latencies: list[float] = []
    samples = Samples(latencies, 0.0)
    deadline = time.monotonic() + max_seconds

    async def worker() -> None:
        nonlocal next_index
        while next_index < requests and time.monotonic() < deadline:
            index = next_index
            next_index += 1
            started = time.perf_counter()
            try:
                await operation(index)
            except Exception as exc:  # a failed call is counted, not fatal to the run
                samples.errors += 1
                samples.first_error = samples.first_error or f"{type(exc).__name__}: {exc}"
                continue
            latencies.append((time.perf_counter() - started) * 1000)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    samples.seconds = time.perf_counter() - started
    return samples


async def graphql_data(
    http: aiohttp.ClientSession,
    url: str,
    headers: dict[str, str],
    query: str,
    variables: dict[str, Any],
) -> dict[str, Any]:
    """POST a GraphQL call (`/graphql` or `/metadata`) and return its `data`; errors raise."""
    async with http.post(
        url, headers=headers, json={"query": query, "variables": variables}
    ) as response:
        body: dict[str, Any] = orjson.loads(await response.read())
    if body.get("errors"):
        raise RuntimeError(f"{url} call failed: {body['errors']}")
    data: dict[str, Any] = body["data"]
    return data


CREATE_WEBHOOK = (
    "mutation($input: CreateWebhookInput!) { createWebhook(input: $input) { id secret } }"
)


def cpu_seconds(processes: Sequence[psutil.Process]) -> float:
    """User plus system CPU seconds of `processes` (those gone meanwhile count nothing)."""
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def client_session(base_url: str, connections: int = 200) -> aiohttp.ClientSession:
    """HTTP/1.1 keep-alive client whose relative URLs go to `base_url` (the gateway).

    aiohttp, not httpx: on this 2-core machine httpx's pool bookkeeping cost the event
    benchmarks' client ~10 ms of CPU per request, enough to starve the stack it measured."""
    return aiohttp.ClientSession(
        base_url=base_url,
        connector=aiohttp.TCPConnector(limit=connections),
        timeout=aiohttp.ClientTimeout(total=120),
    )


async def paced(
    count: int, rate: float, action: Callable[[int], Coroutine[Any, Any, None]]
) -> float:
    """Starts `action(i)` at `rate` per second (open loop), waits for every one; returns the
    seconds it took."""
    started = time.monotonic()
    tasks: list[asyncio.Task[None]] = []
    for index in range(count):
        delay = started + index / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(action(index)))
    await asyncio.gather(*tasks)
    return time.monotonic() - started


def compare(
    operation: str,
    concurrency: int,
    api: Samples,
    floor: Samples | None,
    *,
    budget: str = "",
    check: Callable[[Result], bool] | None = None,
    notes: str = "",
    cpu: dict[str, float] | None = None,
) -> Result:
    """One table row from a measured operation and its floor; `check` decides pass/fail."""
    row = Result(
        operation=operation,
        concurrency=concurrency,
        requests=api.count,
        seconds=api.seconds,
        p50_ms=api.p(50),
        p99_ms=api.p(99),
        floor_p50_ms=floor.p(50) if floor is not None and floor.count else None,
        floor_p99_ms=floor.p(99) if floor is not None and floor.count else None,
        floor_requests_per_second=floor.rate if floor is not None and floor.count else None,
        budget=budget,
        errors=api.errors,
        notes=notes,
        cpu_ms_per_request=cpu or {},
    )
    if api.first_error:
        row.notes = (row.notes + "; " if row.notes else "") + f"first error: {api.first_error}"
    if floor is not None and floor.first_error:
        row.notes = (row.notes + "; " if row.notes else "") + f"floor error: {floor.first_error}"
    if check is not None:
        row.passed = api.count > 0 and api.errors == 0 and check(row)
    return row


class CpuMeter:
    """CPU seconds used by the stack's service processes between start() and stop()."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.processes = {}
        for name, pid in pids.items():
            try:
                self.processes[name] = psutil.Process(pid)
            except psutil.Error:
                continue
        self.before: dict[str, float] = {}

    def _now(self) -> dict[str, float]:
        used = {}
        for name, process in self.processes.items():
            try:
                times = process.cpu_times()
            except psutil.Error:
                continue
            used[name] = times.user + times.system
        return used

    def start(self) -> None:
        self.before = self._now()

    def per_request(self, requests: int) -> dict[str, float]:
        after = self._now()
        return {
            name: round((after[name] - self.before[name]) * 1000 / requests, 3)
            for name in after
            if name in self.before and requests > 0
        }


class TreeCpu:
    """CPU seconds of named process trees between start() and the reading: each root with its
    descendants, so PostgreSQL's backends count with the postmaster. A process that starts in
    between counts whole; one that ends in between counts whole too, in its parent's times of
    reaped children (a backend of a connection opened for one job, say)."""

    def __init__(self, roots: dict[str, list[int]]) -> None:
        self.roots = roots
        self.before: dict[int, float] = {}

    def _now(self) -> dict[str, dict[int, float]]:
        used: dict[str, dict[int, float]] = {}
        for name, pids in self.roots.items():
            part = used.setdefault(name, {})
            for pid in pids:
                try:
                    root = psutil.Process(pid)
                    tree = [root, *root.children(recursive=True)]
                except psutil.Error:
                    continue
                for process in tree:
                    try:
                        times = process.cpu_times()
                    except psutil.Error:
                        continue
                    part[process.pid] = (
                        times.user + times.system + times.children_user + times.children_system
                    )
        return used

    def start(self) -> None:
        self.before = {pid: s for part in self._now().values() for pid, s in part.items()}

    def seconds(self) -> dict[str, float]:
        """CPU seconds per part since start()."""
        return {
            name: sum(s - self.before.get(pid, 0.0) for pid, s in part.items())
            for name, part in self._now().items()
        }

    def per_request(self, requests: int) -> dict[str, float]:
        """CPU milliseconds per request of each part and their sum (`total`)."""
        used = self.seconds()
        if requests <= 0:
            return {}
        split = {name: round(s * 1000 / requests, 3) for name, s in used.items()}
        split["total"] = round(sum(used.values()) * 1000 / requests, 3)
        return split


class TreeMemory:
    """Peak growth of each process's resident memory while sampling, by part of the stack (each
    root with its descendants, as TreeCpu). Counted without shared memory (RSS minus RssShmem):
    a PostgreSQL backend touching the shared buffers grows its RSS by pages it does not own."""

    def __init__(self, roots: dict[str, list[int]], interval: float = 0.2) -> None:
        self.roots = roots
        self.interval = interval
        self.before: dict[int, int] = {}
        self.peak: dict[str, int] = {}
        self._task: asyncio.Task[None] | None = None

    @staticmethod
    def _private(pid: int) -> int | None:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return None
        kb = {
            key: int(value.split()[0])
            for key, _, value in (line.partition(":") for line in status.splitlines())
            if key in ("VmRSS", "RssShmem")
        }
        return (kb.get("VmRSS", 0) - kb.get("RssShmem", 0)) * 1024

    def _tree(self) -> dict[str, list[int]]:
        found: dict[str, list[int]] = {}
        for name, pids in self.roots.items():
            for pid in pids:
                try:
                    root = psutil.Process(pid)
                    tree = [root, *root.children(recursive=True)]
                except psutil.Error:
                    continue
                found.setdefault(name, []).extend(process.pid for process in tree)
        return found

    def _sample(self) -> None:
        for name, pids in self._tree().items():
            for pid in pids:
                size = self._private(pid)
                if size is None:
                    continue
                # A process started meanwhile (a new backend) grows from nothing.
                grown = size - self.before.setdefault(pid, 0)
                self.peak[name] = max(self.peak.get(name, 0), grown)

    async def _loop(self) -> None:
        while True:
            self._sample()
            await asyncio.sleep(self.interval)

    def start(self) -> None:
        for pids in self._tree().values():
            for pid in pids:
                size = self._private(pid)
                if size is not None:
                    self.before[pid] = size
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> dict[str, float]:
        """MB by which the most grown process of each part grew."""
        if self._task is not None:
            self._task.cancel()
        self._sample()
        return {name: round(grown / 2**20, 1) for name, grown in self.peak.items()}


INFRA_NAMES = {"postgres": "postgres", "nats": "nats", "redis": "valkey"}


def stack_processes(stack: Stack) -> dict[str, list[int]]:
    """Every process of the stack by part (the services, PostgreSQL, NATS, Valkey): what the
    throughput rows split their CPU over. PostgreSQL's backends are the postmaster's children."""
    parts = {
        name: [i.process.pid for i in instances if i.process.pid]
        for name, instances in stack.instances.items()
    }
    if stack.infra is not None:
        for server, name in INFRA_NAMES.items():
            found = stack.infra.servers.get(server)
            if found is not None and found.process.pid:
                parts[name] = [found.process.pid]
    return parts


def p50_over_floor(limit_ms: float) -> tuple[str, Callable[[Result], bool]]:
    """Budget: p50 at most `limit_ms` above the floor's p50."""

    def check(row: Result) -> bool:
        return row.floor_p50_ms is not None and row.p50_ms - row.floor_p50_ms <= limit_ms

    return f"p50 <= floor + {limit_ms:g} ms", check


def percentile(samples_ms: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) of latency samples in milliseconds."""
    if not samples_ms:
        return 0.0
    if len(samples_ms) == 1:
        return samples_ms[0]
    cuts = statistics.quantiles(samples_ms, n=100, method="inclusive")
    index = min(max(round(q) - 1, 0), len(cuts) - 1)
    return cuts[index]


def format_table(results: Sequence[Result]) -> str:
    header = (
        f"{'operation':<48} {'conc':>4} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'floor/s':>9} {'floor50':>7} {'ratio':>6}  {'budget':<30} result"
    )
    lines = [header, "-" * len(header)]
    for row in results:
        floor = "" if row.floor_p50_ms is None else f"{row.floor_p50_ms:.2f}"
        floor_rate = (
            "" if row.floor_requests_per_second is None else f"{row.floor_requests_per_second:.1f}"
        )
        ratio = "" if row.ratio_to_floor is None else f"{row.ratio_to_floor:.1f}x"
        verdict = "-" if row.passed is None else ("pass" if row.passed else "FAIL")
        lines.append(
            f"{row.operation:<48} {row.concurrency:>4} {row.requests_per_second:>9.1f} "
            f"{row.p50_ms:>8.2f} {row.p99_ms:>8.2f} {floor_rate:>9} {floor:>7} {ratio:>6}  "
            f"{row.budget:<30} {verdict}"
        )
    return "\n".join(lines)


def write_json(results: Sequence[Result], path: Path, machine: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"machine": machine, "results": [row.as_json() for row in results]}
    path.write_bytes(orjson.dumps(payload, option=orjson.OPT_INDENT_2))


def main_on_own_stack(
    run: Callable[[BenchContext], Coroutine[Any, Any, list[Result]]], description: str, name: str
) -> None:
    """`python bench/<module>.py [--smoke]`: one workload module on a stack of its own."""
    import argparse
    import secrets
    import shutil
    import tempfile

    from crmstack.stack import Stack, StackConfig

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--smoke", action="store_true", help="seconds-long run")
    args = parser.parse_args()
    data_dir = Path(tempfile.mkdtemp(prefix=f"crm-bench-{name}-"))
    stack = Stack(
        StackConfig(
            data_dir=data_dir,
            app_secret=secrets.token_urlsafe(48),
            extra_env={
                "LOG_LEVEL": "WARNING",
                "WEBHOOK_ALLOW_PRIVATE_TARGETS": "true",
                "WEBHOOK_RETRY_DELAYS": "2,4,6",  # see bench_webhook_retries
                "API_RATE_LIMITING_LIMIT": "100000000",  # workloads measure the API, not limits
            },
        )
    )
    stack.start()
    try:
        context = BenchContext(
            base_url=stack.base_url,
            smoke=args.smoke,
            database_url=stack.env["DATABASE_URL"],
            nats_url=stack.env["NATS_URL"],
            service_pids={
                name: instances[0].process.pid or 0
                for name, instances in stack.instances.items()
                if name in ("gateway", "records", "webhooks", "workflows")
            },
            process_pids=stack_processes(stack),
        )
        results: list[Result] = asyncio.run(run(context))
    finally:
        stack.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
    print(format_table(results))
    for row in results:
        print(f"  {row.operation}: {row.requests_per_second:.0f}/s; {row.notes}")

"""`make bench` / `make bench-smoke`: start the stack, seed the data set, run every workload.

    .venv/bin/python bench/run.py            # full run: 130k records seeded, minutes
    .venv/bin/python bench/run.py --smoke    # seconds: tiny data set, few iterations
    .venv/bin/python bench/run.py --only records,burst

The stack is started with the same launcher as `make run` (libs/crmstack), on loopback, and
stopped by PID at the end. Workloads are the modules listed in `WORKLOADS` (contract in
bench/README.md); an optional module that is not there yet is skipped with a note. The table
is printed and written with the machine's description to bench/results/latest.json (smoke:
smoke.json; a partial run: partial.json), with a .txt copy. Exit status: 1 if a workload broke
(raised); budget misses are reported, and fail the run only with --enforce-budgets (never in
smoke mode).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import platform
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from bench import seed as seeding
from bench.benchlib import BenchContext, Result, format_table, stack_processes, write_json
from bench.profiling import Profiler
from bench.settle import settle
from crmstack.ports import free_port
from crmstack.processes import ManagedProcess
from crmstack.stack import ALL_SERVICES, Stack, StackConfig

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"

# Settings of the benchmark stack: the other workloads measure the API, not the rate limiter
# (bench_burst asks for its own gateway with the default limit), and tokens outlive the run.
BENCH_ENV = {
    "LOG_LEVEL": "WARNING",
    "API_RATE_LIMITING_LIMIT": "1000000000",
    "ACCESS_TOKEN_EXPIRES_IN": "2h",
    "WEBHOOK_ALLOW_PRIVATE_TARGETS": "true",
    "WEBHOOK_RETRY_DELAYS": "2,4,6",  # bench_webhook_retries measures retries within seconds
    "RECORD_EVENTS_PUBLISH": os.environ.get("BENCH_EVENTS_PUBLISH", "interested"),
}


@dataclass(frozen=True)
class Workload:
    """A module with `async def run(ctx: BenchContext) -> list[Result]`."""

    name: str
    module: str
    optional: bool = False  # may be absent (another branch adds it): skipped with a note


# In run order: the records workloads first, on a quiet machine.
WORKLOADS = (
    Workload("records", "bench.bench_records"),
    Workload("throughput", "bench.bench_throughput"),
    Workload("updates", "bench.bench_updates"),
    Workload("search", "bench.bench_search"),
    Workload("burst", "bench.bench_burst"),
    Workload("rate_limit", "bench.bench_rate_limit"),
    Workload("webhooks", "bench.bench_webhooks"),
    Workload("webhook_retries", "bench.bench_webhook_retries"),
    Workload("subscriptions", "bench.bench_subscriptions"),
    Workload("workflows", "bench.bench_workflows"),
    Workload("relay", "bench.bench_relay"),
    Workload("events", "bench.bench_events"),
    Workload("imports", "bench.bench_imports"),
    Workload("export", "bench.bench_export"),
)


RunFunction = Callable[[BenchContext], Awaitable[list[Result]]]


def _load(workload: Workload) -> tuple[RunFunction, bool] | None:
    """The module's run() and whether it profiles its parts itself; None if absent."""
    try:
        module = importlib.import_module(workload.module)
    except ModuleNotFoundError as exc:
        if workload.optional and exc.name == workload.module:
            return None
        raise
    run: RunFunction = module.run
    return run, bool(getattr(module, "PROFILES_ITSELF", False))


def _error_row(workload: Workload, exc: BaseException) -> Result:
    return Result(
        operation=f"{workload.name}: ERROR",
        concurrency=0,
        requests=0,
        seconds=0.0,
        p50_ms=0.0,
        p99_ms=0.0,
        passed=False,
        notes=f"{type(exc).__name__}: {exc}",
        module=workload.module,
    )


def _skipped_row(workload: Workload) -> Result:
    return Result(
        operation=f"{workload.name}: not measured",
        concurrency=0,
        requests=0,
        seconds=0.0,
        p50_ms=0.0,
        p99_ms=0.0,
        notes=f"{workload.module} is not in this tree yet (plug point)",
        module=workload.module,
    )


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _git_commit() -> str:
    result = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return result.stdout.strip()


def machine(smoke: bool, sizes: seeding.Sizes, durable: bool) -> dict[str, Any]:
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "load_average_start": [round(x, 2) for x in os.getloadavg()],
        "platform": platform.platform(),
        "python": platform.python_version(),
        "commit": _git_commit(),
        "smoke": smoke,
        "postgres": "durable (fsync, synchronous_commit on)" if durable else "fsync off",
        "data_set": {
            "companies": sizes.companies,
            "people": sizes.people,
            "opportunities": sizes.opportunities,
        },
        "client": "one asyncio process (uvloop, aiohttp, asyncpg) on the same machine",
    }


class ExtraGateways:
    """More gateway processes on the running stack, with other settings; stopped by PID."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.started: list[ManagedProcess] = []

    async def start(self, env: dict[str, str]) -> str:
        port = free_port()
        process = ManagedProcess(
            name=f"gateway-bench-{port}",
            command=[sys.executable, "-m", "gateway"],
            env={
                **self.stack.env,
                "PORT": str(port),
                "HOST": "127.0.0.1",
                "METRICS_PORT": "0",  # its own, never the first gateway's
                **env,
            },
            log_path=self.stack.logs / f"gateway-bench-{port}.log",
        )
        process.start()
        self.started.append(process)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        async with aiohttp.ClientSession() as http:
            while time.monotonic() < deadline and process.is_running():
                try:
                    async with http.get(url + "/healthz") as response:
                        if response.status == 200:
                            return url
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.2)
        raise RuntimeError(f"the extra gateway did not start:\n{process.tail()}")

    def stop(self) -> None:
        for process in self.started:
            process.stop()
        self.started.clear()


async def run_workloads(
    ctx: BenchContext,
    names: set[str] | None,
    sizes: seeding.Sizes,
    gateways: ExtraGateways | None = None,
) -> tuple[list[Result], bool]:
    results: list[Result] = []
    broken = False
    wanted = [w for w in WORKLOADS if names is None or w.name in names]
    if any(w.name == "records" for w in wanted):
        print(
            f"seeding {sizes.companies} companies, {sizes.people} people, "
            f"{sizes.opportunities} opportunities through POST /rest/batch",
            flush=True,
        )
        ctx.seed, seed_row = await seeding.seed(ctx.base_url, sizes)
        if ctx.database_url:
            await seeding.analyze(ctx.database_url, ctx.seed.schema)
        seed_row.module = "bench.seed"
        results.append(seed_row)
    for workload in wanted:
        print(f"== {workload.name} ({workload.module})", flush=True)
        await settle(ctx, timeout=30 if ctx.smoke else 300)
        started = time.monotonic()
        try:
            loaded = _load(workload)
            if loaded is None:
                print(f"   {workload.module} not present: skipped", flush=True)
                results.append(_skipped_row(workload))
                continue
            run, profiles_itself = loaded
            if profiles_itself:
                rows = await run(ctx)
            else:
                async with ctx.profile(workload.name):
                    rows = await run(ctx)
        except Exception as exc:
            traceback.print_exc()
            broken = True
            results.append(_error_row(workload, exc))
            continue
        finally:
            if gateways is not None:
                gateways.stop()  # a module's extra gateways end with it
        for row in rows:
            row.module = workload.module
        results.extend(rows)
        print(f"   {len(rows)} rows in {time.monotonic() - started:.1f} s", flush=True)
    return results, broken


def _note_line(row: Result) -> str:
    parts = [row.notes] if row.notes else []
    if row.cpu_ms_per_request:
        used = ", ".join(f"{name} {ms:.2f}" for name, ms in row.cpu_ms_per_request.items())
        parts.append(f"cpu ms/request: {used}")
    return f"  {row.operation} (c={row.concurrency}): {'; '.join(parts)}" if parts else ""


def main() -> None:
    parser = argparse.ArgumentParser(description="CRM benchmark suite")
    parser.add_argument("--smoke", action="store_true", help="seconds: tiny data, few iterations")
    parser.add_argument("--only", help="comma-separated workload names: " + ", ".join(
        w.name for w in WORKLOADS))  # fmt: skip
    parser.add_argument("--enforce-budgets", action="store_true", help="exit 1 on a budget FAIL")
    parser.add_argument("--keep-data", action="store_true", help="keep the stack's data folder")
    parser.add_argument(
        "--select", help="comma-separated parts of a workload module (e.g. graphql_list,batch)"
    )
    parser.add_argument(
        "--profile",
        help="comma-separated services to sample with py-spy during each workload "
        "(e.g. gateway,records); collapsed stacks in bench/results/profiles/",
    )
    args = parser.parse_args()
    names = set(args.only.split(",")) if args.only else None
    unknown = (names or set()) - {w.name for w in WORKLOADS}
    if unknown:
        parser.error(f"unknown workloads: {', '.join(sorted(unknown))}")
    profiled = args.profile.split(",") if args.profile else []
    if not set(profiled) <= set(ALL_SERVICES):
        parser.error(f"--profile takes services of {', '.join(ALL_SERVICES)}")
    sizes = seeding.SMOKE if args.smoke else seeding.FULL
    durable = not args.smoke
    description = machine(args.smoke, sizes, durable)
    print(
        f"machine: {description['cpu']}, {description['cores']} cores, load average "
        f"{' '.join(str(x) for x in description['load_average_start'])}",
        flush=True,
    )

    data_dir = Path(tempfile.mkdtemp(prefix="crm-bench-"))
    stack = Stack(
        StackConfig(
            data_dir=data_dir,
            app_secret=secrets.token_urlsafe(48),
            extra_env=BENCH_ENV,
            fast_postgres=not durable,
        )
    )
    gateways = ExtraGateways(stack)
    started = time.monotonic()
    print(f"starting the stack (data in {data_dir})", flush=True)
    stack.start()
    print(f"stack up in {time.monotonic() - started:.1f} s; pids in {data_dir / 'stack.json'}")
    try:
        ctx = BenchContext(
            base_url=stack.base_url,
            smoke=args.smoke,
            database_url=stack.env["DATABASE_URL"],
            redis_url=stack.env["REDIS_URL"],
            nats_url=stack.env["NATS_URL"],
            extra={"metrics_url": f"http://127.0.0.1:{stack.instances['gateway'][0].metrics_port}"},
            # A gateway start costs seconds: the smoke run keeps to the one it has.
            start_gateway=None if args.smoke else gateways.start,
            select=set(args.select.split(",")) if args.select else None,
            service_pids={
                name: instances[0].process.pid or 0
                for name, instances in stack.instances.items()
                if name in ("gateway", "records", "webhooks", "workflows")
            },
            process_pids=stack_processes(stack),
        )
        if profiled:
            pids = {name: stack.instances[name][0].process.pid or 0 for name in profiled}
            ctx.profile = Profiler(pids, RESULTS / "profiles")
        results, broken = uvloop.run(run_workloads(ctx, names, sizes, gateways))
    finally:
        gateways.stop()
        stack.stop()
        if not args.keep_data:
            shutil.rmtree(data_dir, ignore_errors=True)

    description["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    description["seconds"] = round(time.monotonic() - started, 1)
    if args.smoke:
        for row in results:
            if not row.operation.endswith(": ERROR"):
                row.passed = None  # budgets are not judged on a smoke run
    table = format_table(results)
    notes = "\n".join(line for line in map(_note_line, results) if line)
    header = (
        f"{'SMOKE RUN: numbers are not meaningful, budgets not enforced. ' if args.smoke else ''}"
        f"{description['cpu']}, {description['cores']} cores, load average "
        f"{description['load_average_start']} -> {description['load_average_end']}, "
        f"postgres {description['postgres']}, {description['seconds']} s"
    )
    print()
    print(header)
    print(table)
    print(notes)
    # A partial run (--only, --select, --profile) must not replace the full run's figures.
    partial = bool(args.only or args.select or args.profile)
    name = "smoke" if args.smoke else ("partial" if partial else "latest")
    write_json(results, RESULTS / f"{name}.json", description)
    (RESULTS / f"{name}.txt").write_text(f"{header}\n{table}\n{notes}\n")
    print(f"\nwritten: {RESULTS / (name + '.json')}")
    failed = any(row.passed is False for row in results)
    sys.exit(1 if broken or (failed and args.enforce_budgets and not args.smoke) else 0)


if __name__ == "__main__":
    main()

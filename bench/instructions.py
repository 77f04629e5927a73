"""Instructions per request of the gateway or records, counted by valgrind's callgrind.

CPU time per request is the figure issue 18 budgets, but on a shared 2-core VM two readings of
the same code differ by ~8% (the machine's speed drifts over seconds), so a change of a few
percent cannot be seen in it. Instructions executed are repeatable to about 1% here, whatever
else the machine does. They count user space only: system calls and context switches are not in
them (count those with `strace -c -f -p <pid>`).

    .venv/bin/python bench/instructions.py                        # both services, every row
    .venv/bin/python bench/instructions.py --service gateway --row rest_list --row graphql_list
    .venv/bin/python bench/instructions.py --pythonpath "$(cat other/paths)"  # another checkout

Starts a stack as bench/run.py does and bench_throughput's two workspaces (1,200 people each).
For each service and row it starts one more instance of the service under callgrind (records:
behind one more plain gateway that calls it), sends N requests, stops it, does the same with 3N,
and reports (instructions(3N) - instructions(N)) / 2N: start-up and shut-down cancel out.
`--pythonpath` runs that instance from other source folders (a `git archive` of another commit:
its src folders joined by ':'), so two commits are compared on one stack. Needs valgrind
(Debian's package). Minutes; not part of `make test` or `make bench`.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from bench import bench_throughput as throughput
from bench.benchlib import client_session, drive
from bench.run import BENCH_ENV, RESULTS
from crmstack.ports import free_port
from crmstack.stack import Stack, StackConfig

ROWS = {row.key: row for row in throughput.ROWS}
SERVICES = ("gateway", "records")
CONCURRENCY = 4  # requests in flight: callgrind runs the service ~50x slower
PRIMING_SECONDS = 300.0
_TOTALS = re.compile(rb"^(?:summary|totals): (\d+)", re.MULTILINE)


@dataclass(frozen=True)
class Target:
    """One more instance of a service, under callgrind, and the gateway URL that reaches it."""

    process: subprocess.Popen[bytes]
    helper: subprocess.Popen[bytes] | None  # the plain gateway in front of a records instance
    base_url: str
    out: Path


def _env(stack: Stack, service: str, **overrides: str) -> dict[str, str]:
    env = dict(stack.instances[service][0].process.env)
    env.update(overrides)
    return env


def _module(service: str) -> list[str]:
    return [sys.executable, "-m", service]


def _spawn(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(command, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT)


def _start(stack: Stack, service: str, out: Path, pythonpath: str) -> Target:
    callgrind = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
    extra = {"PYTHONPATH": pythonpath} if pythonpath else {}
    logs = stack.logs
    if service == "gateway":
        port = free_port()
        env = _env(stack, "gateway", PORT=str(port), METRICS_PORT=str(free_port()), **extra)
        process = _spawn([*callgrind, *_module("gateway")], env, logs / "instructions-gateway.log")
        return Target(process, None, f"http://127.0.0.1:{port}", out)
    grpc_port = free_port()
    env = _env(stack, "records", GRPC_PORT=str(grpc_port), METRICS_PORT=str(free_port()), **extra)
    process = _spawn([*callgrind, *_module("records")], env, logs / "instructions-records.log")
    port = free_port()
    gateway_env = _env(
        stack,
        "gateway",
        PORT=str(port),
        METRICS_PORT=str(free_port()),
        RECORDS_ADDR=f"127.0.0.1:{grpc_port}",
    )
    helper = _spawn(_module("gateway"), gateway_env, logs / "instructions-helper.log")
    return Target(process, helper, f"http://127.0.0.1:{port}", out)


async def _ready(target: Target, timeout: float = 300) -> None:
    """Until the target answers a request of the row (a records instance is slow to start)."""
    deadline = time.monotonic() + timeout
    path = "/readyz" if target.helper is not None else "/livez"
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            if target.process.poll() is not None:
                raise RuntimeError(f"the instance under callgrind exited ({target.out.name})")
            try:
                async with http.get(target.base_url + path) as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(1)
    raise TimeoutError(f"{target.base_url} did not answer within {timeout:.0f} s")


def _stop(target: Target) -> int:
    """Stops the instance and answers the instructions callgrind counted."""
    if target.helper is not None:
        target.helper.send_signal(signal.SIGINT)
        target.helper.wait(60)
    target.process.send_signal(signal.SIGINT if target.helper is None else signal.SIGTERM)
    target.process.wait(300)
    found = _TOTALS.search(target.out.read_bytes())
    if found is None:
        raise RuntimeError(f"no totals in {target.out}")
    return int(found.group(1))


async def _primed(
    http: aiohttp.ClientSession, key: str, workload: throughput.Workload, tag: str
) -> None:
    """Until one request of the row succeeds: a gateway under callgrind answers /livez before
    its first gRPC call can complete (its first few calls answered 503), and the N and 3N runs
    then differ only by the requests they count."""
    deadline = time.monotonic() + PRIMING_SECONDS
    for attempt in itertools.count():
        try:
            await throughput.request_once(http, key, workload, f"p{tag}.{attempt}")
            return
        except (throughput.CheckFailed, aiohttp.ClientError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(1)


async def _requests(target: Target, key: str, workload: throughput.Workload, count: int) -> None:
    tag = secrets.token_hex(4)
    async with client_session(target.base_url, CONCURRENCY) as http:
        await _primed(http, key, workload, tag)

        async def one(i: int) -> object:
            return await throughput.request_once(http, key, workload, f"i{tag}.{i}")

        samples = await drive(one, concurrency=CONCURRENCY, requests=count, max_seconds=3600)
    if samples.errors:
        raise RuntimeError(f"{samples.errors} of {count} requests failed: {samples.first_error}")


async def count_instructions(
    stack: Stack, keys: throughput.Keys, service: str, row: str, count: int, pythonpath: str
) -> float:
    workload = ROWS[row]
    totals = []
    with tempfile.TemporaryDirectory(prefix="crm-instructions-") as folder:
        for requests in (count, 3 * count):
            target = _start(stack, service, Path(folder) / f"{requests}.out", pythonpath)
            try:
                await _ready(target)
                await _requests(target, keys.for_row(workload), workload, requests)
            finally:
                totals.append(_stop(target))
    return (totals[1] - totals[0]) / (2 * count)


async def measure(args: argparse.Namespace, stack: Stack) -> list[str]:
    keys = await throughput.prepare_keys(stack.base_url)
    lines = []
    for service in args.service:
        for row in args.row:
            per_request = await count_instructions(
                stack, keys, service, row, args.requests, args.pythonpath
            )
            line = f"{service:<8} {row:<12} {per_request:>12,.0f} instructions per request"
            print(line, flush=True)
            lines.append(line)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--service", action="append", choices=SERVICES)
    parser.add_argument("--row", action="append", choices=sorted(ROWS))
    parser.add_argument("--requests", type=int, default=200, help="N (the runs send N and 3N)")
    parser.add_argument("--pythonpath", default="", help="source folders of the measured code")
    args = parser.parse_args()
    args.service = args.service or list(SERVICES)
    args.row = args.row or sorted(ROWS)
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install -y valgrind)")
    data_dir = Path(tempfile.mkdtemp(prefix="crm-instructions-"))
    stack = Stack(
        StackConfig(data_dir=data_dir, app_secret=secrets.token_urlsafe(48), extra_env=BENCH_ENV)
    )
    stack.start()
    try:
        lines = uvloop.run(measure(args, stack))
    finally:
        stack.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
    label = f" (PYTHONPATH {args.pythonpath})" if args.pythonpath else ""
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "instructions.txt").write_text(f"{os.uname().nodename}{label}\n" + "\n".join(lines))


if __name__ == "__main__":
    main()

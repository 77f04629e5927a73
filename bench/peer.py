"""`make bench-peer`: the project and Directus 12.4 side by side, in one run on one machine.

    .venv/bin/python bench/peer.py                 # 20 s per workload, as shared/peers/load.sh
    .venv/bin/python bench/peer.py --seconds 10    # shorter
    .venv/bin/python bench/peer.py --no-peer       # the project's rows alone
    .venv/bin/python bench/peer.py --rounds 8      # each row's seconds in 8 rounds (default 4)
    .venv/bin/python bench/peer.py --no-peer --gc  # and the collector's share of each service's CPU

The peer is the harness in `shared/peers/` (PEER_HARNESS names its folder; by default the first
`shared/peers` beside the checkout or one level up): `directus.sh setup` installs Directus from
the npm registry under DIRECTUS_HOME (default /tmp/directus-peer, outside the repository;
minutes the first time, seconds after), on the machine's PostgreSQL (PG_HOST/PG_PORT, default
127.0.0.1:5432). Both get the same data set (1,200 people, one in ten an Engineer) and the same
two wrk workloads as `load.sh` (c16, a filtered list of 20 and a create with a unique email);
the project also gets them through GraphQL. The six rows run interleaved (bench_throughput's
`interleaved`): each round runs every row once, Directus's list beside the project's lists and
its create beside the project's creates, forwards then backwards, with Directus running
throughout; so the speed a shared VM drifts by over minutes reaches both sides of a ratio alike
(measured one after the other, the project's rows ran on a machine up to 40% faster or slower
than Directus's had). The rate budgets also print each round's ratio. CPU per request is read
per process from /proc: every process of the project's stack, and for Directus its node process
plus the PostgreSQL backends of its database and PostgreSQL's own auxiliary processes.

Prints each row, then the ratios against the issue-18 budgets: REST create >= 6x Directus's
creates/s, REST list >= 4x its lists/s, CPU per create <= 1.3x CPU per list, GraphQL within 1.3x
of REST's CPU. Writes bench/results/peer.json and peer.txt. Not part of `make test`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from bench import bench_throughput as throughput
from bench import collector, wrk
from bench.benchlib import (
    BenchContext,
    Result,
    TreeCpu,
    format_table,
    stack_processes,
    write_json,
)
from bench.run import BENCH_ENV, RESULTS, machine
from bench.seed import SMOKE
from crmstack.stack import Stack, StackConfig

ROOT = Path(__file__).resolve().parents[1]
DIRECTUS_BASE = f"http://127.0.0.1:{os.environ.get('DIRECTUS_PORT', '8055')}"
DIRECTUS_TOKEN = "bench-static-admin-token-1234567890"  # noqa: S105 (the harness's, loopback)
DIRECTUS_LIST = "/items/people?limit=20&filter%5Bjob_title%5D%5B_eq%5D=Engineer"
DIRECTUS_CREATE_BODY = (
    f'{{"first_name": "W", "last_name": "K", "job_title": "Sales", "email": "{wrk.UNIQUE}@ex.com"}}'
)
BUDGETS = (
    # (name, numerator row, denominator row, what is compared, budget, at least?)
    ("REST create vs Directus creates/s", "project create", "directus create", "rate", 6.0, True),
    ("REST list 20 vs Directus lists/s", "project list", "directus list", "rate", 4.0, True),
    ("CPU per create / CPU per list", "project create", "project list", "cpu", 1.3, False),
    ("GraphQL list / REST list CPU", "project graphql list", "project list", "cpu", 1.3, False),
    ("GraphQL create / REST create CPU", "project graphql create", "project create", "cpu", 1.3,
     False),
)  # fmt: skip


def harness() -> Path:
    candidates = [os.environ.get("PEER_HARNESS", "")]
    candidates += [str(parent / "shared" / "peers") for parent in ROOT.parents[:3]]
    for candidate in candidates:
        if candidate and (Path(candidate) / "directus.sh").exists():
            return Path(candidate)
    raise SystemExit("the peer harness (shared/peers/directus.sh) is not found: set PEER_HARNESS")


def directus(command: str, **env: str) -> None:
    print(f"directus.sh {command}", flush=True)
    subprocess.run(
        ["bash", str(harness() / "directus.sh"), command], check=True, env={**os.environ, **env}
    )


@dataclass
class Row:
    name: str
    rate: float
    p50_ms: float
    p99_ms: float
    errors: int
    cpu: dict[str, float]

    def line(self) -> str:
        split = ", ".join(f"{k} {v:.2f}" for k, v in self.cpu.items() if k != "total")
        return (
            f"{self.name:<24} {self.rate:>9.1f} {self.p50_ms:>8.2f} {self.p99_ms:>8.2f} "
            f"{self.errors:>6} {self.cpu.get('total', 0.0):>8.3f}  {split}"
        )


class DirectusCpu(TreeCpu):
    """Directus's node process tree, its database's backends and PostgreSQL's auxiliary
    processes (found again at each reading: backends come and go with its pool)."""

    def __init__(self, node_pid: int, database_url: str) -> None:
        super().__init__({"directus": [node_pid], "postgres": []})
        self.database_url = database_url

    async def refresh(self) -> None:
        connection = await asyncpg.connect(self.database_url)
        try:
            rows = await connection.fetch(
                "SELECT pid FROM pg_stat_activity WHERE datname = 'directus' OR datname IS NULL"
            )
        finally:
            await connection.close()
        self.roots["postgres"] = [row["pid"] for row in rows]


def directus_database_url() -> str:
    env = os.environ.get
    return (
        f"postgresql://{env('PG_USER', 'postgres')}@{env('PG_HOST', '127.0.0.1')}:"
        f"{env('PG_PORT', '5432')}/directus"
    )


async def vacuumed(database_url: str, timeout: float = 120.0) -> None:
    """Waits until no autovacuum worker runs on Directus's database: as the project's rows wait
    for their own (bench/settle.py), so neither side's writes are vacuumed during the other's
    next row."""
    connection = await asyncpg.connect(database_url)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not await connection.fetchval(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE backend_type = 'autovacuum worker' AND datname = current_database()"
            ):
                return
            await asyncio.sleep(0.5)
    finally:
        await connection.close()


async def emptied_people(database_url: str) -> None:
    """Directus's people table emptied before the seed, so both sides start from the same 1,200
    people: the harness's seed adds them again on every run and every run's creates stay, so the
    table grew by ~6,000 rows a run (28,762 after five runs on one machine) and Directus's
    filtered list, which reads them all, slowed run after run (PostgreSQL 0.41 -> 1.42 ms a
    list)."""
    connection = await asyncpg.connect(database_url)
    try:
        if await connection.fetchval("SELECT to_regclass('public.people') IS NOT NULL"):
            await connection.execute("TRUNCATE public.people")
    finally:
        await connection.close()


def directus_rows() -> list[throughput.Row]:
    """Directus's two workloads as rows of `throughput.interleaved` (Directus started)."""
    home = Path(os.environ.get("DIRECTUS_HOME", "/tmp/directus-peer"))  # noqa: S108 (the harness's)
    node_pid = int((home / "pid").read_text())
    database_url = directus_database_url()

    def row(kind: str, request: wrk.Request) -> throughput.Row:
        async def measure_once(seconds: float, number: int) -> Result:
            meter = DirectusCpu(node_pid, database_url)
            await meter.refresh()
            meter.start()
            run = await wrk.run(DIRECTUS_BASE, request, connections=16, seconds=seconds)
            await meter.refresh()
            await vacuumed(database_url)
            return Result(
                operation=f"Directus {kind}",
                concurrency=16,
                requests=run.requests,
                seconds=run.seconds,
                p50_ms=run.p50_ms,
                p99_ms=run.p99_ms,
                errors=run.non2xx + run.socket_errors,
                notes=f"wrk -t{wrk.THREADS} -c16",
                cpu_ms_per_request=meter.per_request(run.requests),
            )

        return throughput.Row(f"directus {kind}", f"Directus {kind}", measure_once)

    return [
        row("list", wrk.Request(DIRECTUS_LIST, DIRECTUS_TOKEN)),
        row("create", wrk.Request("/items/people", DIRECTUS_TOKEN, DIRECTUS_CREATE_BODY)),
    ]


# Before the measured rounds, each row runs this long uncounted: Directus starts with a cold
# JavaScript JIT, the project with cold caches and pools.
WARMUP_SECONDS = 3.0

# The row name of each measured row, in the order a round runs them: each budget's two rows side
# by side (Directus's list beside the project's, then the creates).
PROJECT_NAMES = {
    throughput.REST_LIST_ROW.key: "project list",
    throughput.GRAPHQL_LIST_ROW.key: "project graphql list",
    throughput.REST_CREATE_ROW.key: "project create",
    throughput.GRAPHQL_CREATE_ROW.key: "project graphql create",
}
ORDER = (
    "directus list",
    throughput.REST_LIST_ROW.key,
    throughput.GRAPHQL_LIST_ROW.key,
    "directus create",
    throughput.REST_CREATE_ROW.key,
    throughput.GRAPHQL_CREATE_ROW.key,
)


def _row(name: str, result: Result) -> Row:
    return Row(
        name,
        result.requests_per_second,
        result.p50_ms,
        result.p99_ms,
        result.errors,
        result.cpu_ms_per_request,
    )


async def measure_all(
    ctx: BenchContext, seconds: float, rounds: int, peer: bool
) -> tuple[list[Row], list[Result], dict[str, list[Result]]]:
    """The project's four rows and (with `peer`) Directus's two, interleaved in `rounds`
    rounds of `seconds / rounds` per row, Directus running throughout."""
    keys = await throughput.prepare_keys(ctx.base_url)
    measured_rows = throughput.project_rows(ctx, keys, throughput.ROWS)
    if peer:
        directus("setup")
        directus("start")
    try:
        if peer:
            await emptied_people(directus_database_url())
            directus("seed", N=str(throughput.PEOPLE))
            measured_rows += directus_rows()
        by_key = {row.key: row for row in measured_rows}
        ordered = [by_key[key] for key in ORDER if key in by_key]
        merged, per_round = await throughput.interleaved(ordered, seconds, rounds, WARMUP_SECONDS)
    finally:
        if peer:
            directus("stop")
    rows = [_row(PROJECT_NAMES.get(key, key), result) for key, result in merged.items()]
    results = [result for key, result in merged.items() if key in PROJECT_NAMES]
    rounds_by_name = {PROJECT_NAMES.get(key, key): found for key, found in per_round.items()}
    return rows, results, rounds_by_name


def round_ratios(rounds: dict[str, list[Result]], top: str, bottom: str) -> str:
    """The rate ratio of two rows in each round (they ran side by side in it)."""
    pairs = zip(rounds.get(top, []), rounds.get(bottom, []), strict=False)
    return " ".join(
        f"{a.requests_per_second / b.requests_per_second:.2f}x"
        for a, b in pairs
        if b.requests_per_second
    )


def verdicts(
    rows: dict[str, Row], rounds: dict[str, list[Result]] | None = None
) -> tuple[list[str], bool]:
    lines, ok = [], True
    for label, top, bottom, what, budget, at_least in BUDGETS:
        if top not in rows or bottom not in rows:
            lines.append(f"{label:<36} not measured")
            continue
        if what == "rate":
            a, b = rows[top].rate, rows[bottom].rate
        else:
            a, b = rows[top].cpu.get("total", 0.0), rows[bottom].cpu.get("total", 0.0)
        ratio = a / b if b else float("inf")
        passed = ratio >= budget if at_least else ratio <= budget
        ok = ok and passed
        sign = ">=" if at_least else "<="
        each = round_ratios(rounds or {}, top, bottom) if what == "rate" else ""
        lines.append(
            f"{label:<36} {ratio:>6.2f}x  budget {sign} {budget:g}x  {'pass' if passed else 'FAIL'}"
            + (f"  (rounds: {each})" if each else "")
        )
    for kind in ("list", "create"):
        mine, theirs = rows.get(f"project {kind}"), rows.get(f"directus {kind}")
        if mine and theirs and mine.cpu.get("total"):
            lines.append(
                f"Directus CPU / project CPU, {kind:<7}   "
                f"{theirs.cpu.get('total', 0.0) / mine.cpu['total']:>6.2f}x  (information)"
            )
    return lines, ok


def main() -> None:
    parser = argparse.ArgumentParser(description="the project beside Directus 12.4 (issue 18)")
    parser.add_argument("--seconds", type=float, default=20.0, help="per workload (load.sh: 20)")
    parser.add_argument(
        "--rounds",
        type=int,
        default=throughput.FULL_ROUNDS,
        help="rounds each row's seconds are split into, every row once per round",
    )
    parser.add_argument("--no-peer", action="store_true", help="the project's rows only")
    parser.add_argument("--enforce-budgets", action="store_true", help="exit 1 on a FAIL")
    parser.add_argument(
        "--gc", action="store_true", help="report the garbage collector's CPU in each service"
    )
    args = parser.parse_args()
    if not wrk.available():
        raise SystemExit("wrk is not installed (apt-get install -y wrk)")
    description: dict[str, Any] = machine(False, SMOKE, True)
    description["data_set"] = {"people": throughput.PEOPLE}
    description["client"] = f"wrk -t{wrk.THREADS} -c{throughput.CONNECTIONS}"
    description["rounds"] = args.rounds
    data_dir = Path(tempfile.mkdtemp(prefix="crm-peer-"))
    probe_dir = data_dir / "gc"
    env = dict(BENCH_ENV)
    if args.gc:
        probe_dir.mkdir()
        env.update(collector.probe_env(probe_dir))
    stack = Stack(
        StackConfig(data_dir=data_dir, app_secret=secrets.token_urlsafe(48), extra_env=env)
    )
    print(f"starting the stack (data in {data_dir})", flush=True)
    stack.start()
    header = (
        f"{'':<24} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6} {'cpu ms':>8}  "
        "cpu ms per request by process"
    )
    print(header, flush=True)
    try:
        ctx = BenchContext(
            base_url=stack.base_url,
            smoke=False,
            database_url=stack.env["DATABASE_URL"],
            redis_url=stack.env["REDIS_URL"],
            nats_url=stack.env["NATS_URL"],
            process_pids=stack_processes(stack),
        )
        rows, results, rounds = uvloop.run(
            measure_all(ctx, args.seconds, max(1, args.rounds), not args.no_peer)
        )
    finally:
        stack.stop()
        collected = collector.report(probe_dir) if args.gc else []
        shutil.rmtree(data_dir, ignore_errors=True)
    description["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    lines, ok = verdicts({row.name: row for row in rows}, rounds)
    text = "\n".join(
        [
            f"{description['cpu']}, {description['cores']} cores, load average "
            f"{description['load_average_start']} -> {description['load_average_end']}",
            header,
            *(row.line() for row in rows),
            "",
            *lines,
        ]
    )
    print()
    print(text)
    print()
    print(format_table(results))
    if collected:
        print("\nthe garbage collector, whole run (bench/collector.py):")
        print("\n".join(collected))
    description["peer_rows"] = [row.__dict__ for row in rows]
    description["budgets"] = lines
    write_json(results, RESULTS / "peer.json", description)
    (RESULTS / "peer.txt").write_text(text + "\n")
    print(f"\nwritten: {RESULTS / 'peer.json'}")
    sys.exit(1 if args.enforce_budgets and not ok else 0)


if __name__ == "__main__":
    main()

"""REST writes with Valkey up, then stopped: the cost of the degraded mode (issue #26, item 5).

`python bench/bench_valkey_down.py [--seconds 10] [--concurrency 8] [--rounds 1]` starts a
stack of its own (the launcher, embedded servers), signs up, then drives `POST /rest/people` in
a closed loop for the same time with Valkey up, then `--rounds` times stopped (rate limits fail
open, credentials are answered by identity from PostgreSQL) and up again, and prints one row
each and the ratio of the outages' mean throughput to the mean of the runs with Valkey up (the
runs alternate, so the machine's load and the table's growth drift into both sides alike).
Everything it starts is stopped by PID. Not part of `make bench`: it stops a server of its
stack.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import shutil
import tempfile
from pathlib import Path

import httpx

from bench.benchlib import Result, client_session, drive, format_table
from crmstack.client import signup
from crmstack.stack import Stack, StackConfig


async def _writes(
    base_url: str, headers: dict[str, str], label: str, args: argparse.Namespace
) -> Result:
    async with client_session(base_url) as session:

        async def create(index: int) -> None:
            async with session.post(
                "/rest/people", json={"firstName": f"V{index}"}, headers=headers
            ) as response:
                if response.status != 201:
                    raise RuntimeError(f"{response.status}: {await response.text()}")

        samples = await drive(
            create,
            concurrency=args.concurrency,
            requests=10**9,
            max_seconds=args.seconds,
            warmup=20,
        )
    return Result(
        operation=f"POST /rest/people, Valkey {label}",
        concurrency=args.concurrency,
        requests=samples.count,
        seconds=samples.seconds,
        p50_ms=samples.p(50),
        p99_ms=samples.p(99),
        errors=samples.errors,
        notes=samples.first_error,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=1, help="outages, each followed by a run up")
    args = parser.parse_args()
    data_dir = Path(tempfile.mkdtemp(prefix="crm-bench-valkey-"))
    stack = Stack(
        StackConfig(
            data_dir=data_dir,
            app_secret=secrets.token_urlsafe(48),
            extra_env={"LOG_LEVEL": "WARNING", "API_RATE_LIMITING_LIMIT": "100000000"},
        )
    )
    stack.start()
    try:
        with httpx.Client(base_url=stack.base_url, timeout=30) as http:
            headers = signup(http).headers
        runs = [asyncio.run(_writes(stack.base_url, headers, "up", args))]
        for _ in range(args.rounds):
            stack.stop_infra("redis")
            try:
                runs.append(asyncio.run(_writes(stack.base_url, headers, "down", args)))
            finally:
                stack.start_infra("redis")
            runs.append(asyncio.run(_writes(stack.base_url, headers, "up again", args)))
    finally:
        stack.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
    print(format_table(runs))
    up, down = runs[0::2], runs[1::2]
    # Against the runs with Valkey up around each outage, so a drift of the machine's load or of
    # the table's size does not count as the outage's cost.
    mean_up = sum(run.requests_per_second for run in up) / len(up)
    mean_down = sum(run.requests_per_second for run in down) / len(down)
    print(f"throughput with Valkey down: {mean_down / mean_up:.0%} of Valkey up")


if __name__ == "__main__":
    main()

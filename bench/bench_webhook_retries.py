"""Webhook retry lateness under load: how long after its due time each retry arrives while fresh
deliveries to the same target keep flowing.

People are created through `POST /rest/people` at a steady rate; one in `SUBJECT_EVERY` is
answered 503 three times by the receiver (then 200), the others after `WORK_MS` (so the target's
slots stay busy). With `WEBHOOK_RETRY_DELAYS=2,4,6` (the benchmark stack's), retry n is due
`delay n` after the answer to the attempt before it; lateness = arrival - due, on the receiver's
clock. Budget: p99 under 1 s.

    .venv/bin/python bench/bench_webhook_retries.py            # starts a stack, full run
    .venv/bin/python bench/bench_webhook_retries.py --smoke    # seconds, proves it works
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections import defaultdict
from pathlib import Path

import orjson
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.bench_webhooks import _create_webhook, _signup
from bench.benchlib import (
    BenchContext,
    Result,
    client_session,
    main_on_own_stack,
    paced,
    percentile,
)
from crmstack.ports import free_port

DELAYS = (2.0, 4.0, 6.0)  # WEBHOOK_RETRY_DELAYS of the benchmark stack
FAILURES = len(DELAYS)
SUBJECT_EVERY = 20
WORK_MS = 30
BUDGET_MS = 1000.0


class Receiver:
    """Fails each subject's first attempts, answers the others after WORK_MS (unsigned)."""

    def __init__(self) -> None:
        self.answered: dict[str, list[float]] = defaultdict(list)
        self.arrived: dict[str, list[float]] = defaultdict(list)
        self.fresh = 0

    async def handle(self, request: web.Request) -> web.Response:
        arrived = time.monotonic()
        payload = orjson.loads(await request.read())
        name = str((payload.get("record") or {}).get("firstName", ""))
        if not name.startswith("r"):
            await asyncio.sleep(WORK_MS / 1000)
            self.fresh += 1
            return web.Response(status=200)
        attempts = self.arrived[name]
        attempts.append(arrived)
        status = 503 if len(attempts) <= FAILURES else 200
        self.answered[name].append(time.monotonic())
        return web.Response(status=status)

    def lateness_ms(self) -> list[list[float]]:
        """Per retry number, each subject's lateness."""
        late: list[list[float]] = [[] for _ in DELAYS]
        for name, arrivals in self.arrived.items():
            answers = self.answered[name]
            for n, delay in enumerate(DELAYS):
                if len(arrivals) > n + 1:
                    late[n].append((arrivals[n + 1] - answers[n] - delay) * 1000)
        return late


async def run(ctx: BenchContext) -> list[Result]:
    receiver = Receiver()
    app = web.Application()
    app.router.add_post("/hook", receiver.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    rate = 100.0 if ctx.smoke else 200.0
    seconds = 3.0 if ctx.smoke else 30.0
    total = int(rate * seconds)
    subjects = total // SUBJECT_EVERY
    try:
        async with client_session(ctx.base_url) as http:
            headers = await _signup(http)
            await _create_webhook(http, headers, f"http://127.0.0.1:{port}/hook")
            gate = asyncio.Semaphore(64)
            failures: list[int] = []

            async def create(index: int) -> None:
                name = f"r{index}" if index % SUBJECT_EVERY == 0 else f"f{index}"
                async with (
                    gate,
                    http.post("/rest/people", headers=headers, json={"firstName": name}) as answer,
                ):
                    await answer.read()
                    if answer.status != 201:
                        failures.append(answer.status)

            elapsed = await paced(total, rate, create)
            deadline = time.monotonic() + sum(DELAYS) + 60
            while time.monotonic() < deadline:
                if sum(len(a) > FAILURES for a in receiver.arrived.values()) >= subjects:
                    break
                await asyncio.sleep(0.5)
    finally:
        await runner.cleanup()
    late = receiver.lateness_ms()
    every = [value for per_retry in late for value in per_retry]
    per_retry = ", ".join(
        f"retry {n + 1} ({DELAYS[n]:g} s) p50 {percentile(values, 50):.0f} / p99 "
        f"{percentile(values, 99):.0f} ms"
        for n, values in enumerate(late)
    )
    done = sum(len(a) > FAILURES for a in receiver.arrived.values())
    p99 = percentile(every, 99)
    return [
        Result(
            operation=f"webhook: retry lateness under {rate:.0f} events/s",
            concurrency=1,
            requests=len(every),
            seconds=elapsed,
            p50_ms=percentile(every, 50),
            p99_ms=p99,
            budget=f"p99 < {BUDGET_MS:.0f} ms",
            passed=done == subjects and not failures and p99 < BUDGET_MS,
            notes=f"{per_retry}; {done}/{subjects} subjects delivered after {FAILURES} "
            f"failures, {receiver.fresh} fresh answered after {WORK_MS} ms, "
            f"{len(failures)} writes failed",
        )
    ]


def main() -> None:
    main_on_own_stack(run, __doc__.split("\n\n")[0], "webhook_retries")


if __name__ == "__main__":
    main()

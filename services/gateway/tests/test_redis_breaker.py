"""The gateway's Redis connection while Redis is unreachable (its breaker): after a failed
connect, commands fail at once without a connection attempt of their own, one reconnect per
interval runs in the background, and the first one that succeeds serves the next commands."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway.redis_connection import PipelinedRedis


class SilentThenRedis:
    """A Redis host (served by `loopback_server`) that accepts and never answers until `answer` is
    set, then answers every command `+OK`; counts connections."""

    def __init__(self) -> None:
        self.connections = 0
        self.answer = False

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        answering = self.answer
        while data := await reader.read(65536):
            if answering:
                writer.write(b"+OK\r\n" * data.count(b"*"))
                await writer.drain()
        writer.close()


async def test_with_redis_hanging_commands_fail_at_once_and_one_reconnect_runs(
    loopback_server: Callable[..., Awaitable[int]],
) -> None:
    server = SilentThenRedis()
    port = await loopback_server(server.serve)
    # Database 1: the handshake sends SELECT, which a hanging host never answers.
    redis = PipelinedRedis(f"redis://127.0.0.1:{port}/1", timeout=0.5, reconnect_interval=0.3)
    background = "reconnecting in the background"
    try:
        with pytest.raises(RedisConnectionError, match="cannot connect"):
            await redis.get("k")  # the attempt that finds Redis down
        assert server.connections == 1
        await asyncio.sleep(0.35)  # past the reconnect interval
        # Concurrent commands: none attempts a connection or waits for the one attempt they
        # start in the background (it lasts the whole timeout: the host hangs).
        results = await asyncio.gather(
            *(redis.get("k") for _ in range(200)), return_exceptions=True
        )
        assert {str(result) for result in results} == {f"Redis unreachable; {background}"}
        await asyncio.sleep(1.0)  # the background attempt times out
        assert server.connections == 2

        server.answer = True
        await asyncio.sleep(0.35)  # past the reconnect interval again
        with pytest.raises(RedisConnectionError, match=background):
            await redis.get("k")  # starts the reconnect, does not wait for it
        for _ in range(100):
            await asyncio.sleep(0.02)
            with contextlib.suppress(RedisConnectionError):
                reply = await redis.get("k")
                break
        assert reply == b"OK"  # the background reconnect serves the next commands
        assert server.connections == 3
    finally:
        await redis.close()

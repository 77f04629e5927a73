"""The rate limiter's pipelined Redis connection against the stack's real Redis (Valkey): every
concurrent caller gets its own reply, scripts survive a flush, a dropped or stalled connection is
replaced, and the URL's user, password and database are used."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from crm.common.v1 import common_pb2
from crmstack.stack import Stack
from gateway.ratelimit.limiter import RateLimiter
from gateway.redis_connection import PipelinedRedis


@pytest.fixture
def redis_url(local_stack: Stack) -> str:
    assert local_stack.infra is not None
    return local_stack.infra.redis_url


@pytest.fixture
async def admin_redis(redis_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_url)
    yield client
    await client.aclose()


def _api_key() -> common_pb2.Principal:
    return common_pb2.Principal(
        workspace_id=secrets.token_hex(8),
        kind=common_pb2.PRINCIPAL_KIND_API_KEY,
        credential_id=secrets.token_hex(8),
    )


async def test_concurrent_commands_each_get_their_own_reply(redis_url: str) -> None:
    connection = PipelinedRedis(redis_url)
    try:
        replies = await asyncio.gather(
            *(connection.execute("ECHO", f"call-{number}") for number in range(500))
        )
    finally:
        await connection.close()
    assert replies == [f"call-{number}".encode() for number in range(500)]


async def test_concurrent_checks_of_one_credential_admit_exactly_the_limit(redis_url: str) -> None:
    connection = PipelinedRedis(redis_url)
    limiter = RateLimiter(connection, limit=40, window_ms=60_000)
    principal = _api_key()
    try:
        decisions = await asyncio.gather(*(limiter.check(principal) for _ in range(100)))
    finally:
        await connection.close()
    assert all(decision is not None for decision in decisions)
    admitted = [decision for decision in decisions if decision and decision.allowed]
    assert len(admitted) == 40
    assert sorted(decision.remaining for decision in admitted) == list(range(40))


async def test_a_flushed_script_cache_is_refilled(redis_url: str, admin_redis: Redis) -> None:
    connection = PipelinedRedis(redis_url)
    limiter = RateLimiter(connection, limit=5, window_ms=60_000)
    principal = _api_key()
    try:
        first = await limiter.check(principal)
        await admin_redis.script_flush()
        second = await limiter.check(principal)
    finally:
        await connection.close()
    assert first is not None
    assert second is not None
    assert (first.remaining, second.remaining) == (4, 3)


async def test_a_killed_connection_is_replaced_on_the_next_call(
    redis_url: str, admin_redis: Redis
) -> None:
    connection = PipelinedRedis(redis_url)
    try:
        client_id = await connection.execute("CLIENT", "ID")
        assert isinstance(client_id, int)
        assert await admin_redis.client_kill_filter(_id=str(client_id)) == 1
        await asyncio.sleep(0.05)  # the close reaches the connection
        assert await connection.execute("ECHO", "again") == b"again"
    finally:
        await connection.close()


async def test_a_stalled_server_times_out_then_the_connection_recovers(
    redis_url: str, admin_redis: Redis
) -> None:
    connection = PipelinedRedis(redis_url, timeout=0.3)
    try:
        assert await connection.execute("PING") == b"PONG"
        await admin_redis.client_pause(800, all=True)
        with pytest.raises(RedisTimeoutError):
            await connection.execute("PING")
        await asyncio.sleep(0.8)
        assert await connection.execute("PING") == b"PONG"
    finally:
        await connection.close()


async def test_user_password_and_database_come_from_the_url(
    redis_url: str, admin_redis: Redis
) -> None:
    user, password = f"limiter-{secrets.token_hex(4)}", secrets.token_hex(12)
    await admin_redis.acl_setuser(
        user, enabled=True, passwords=[f"+{password}"], keys=["*"], commands=["+@all"]
    )
    host_port = redis_url.split("//", 1)[1].split("/", 1)[0]
    connection = PipelinedRedis(f"redis://{user}:{password}@{host_port}/7")
    wrong = PipelinedRedis(f"redis://{user}:not-{password}@{host_port}/7")
    key = f"crm:test:{secrets.token_hex(4)}"
    try:
        assert await connection.execute("SET", key, "seen") == b"OK"
        in_db7 = Redis.from_url(f"redis://{host_port}/7")
        assert await in_db7.get(key) == b"seen"
        assert await admin_redis.get(key) is None  # not in the URL's default database
        await in_db7.delete(key)
        await in_db7.aclose()
        with pytest.raises(RedisConnectionError):
            await wrong.execute("PING")
    finally:
        await connection.close()
        await wrong.close()
        await admin_redis.acl_deluser(user)

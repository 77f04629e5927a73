"""The gateway's Redis connection: one pipelined socket for the calls made on every request.

Every authenticated request makes two Redis calls: the credential's cache entry (GET, auth) and
the rate-limit script (EVALSHA). redis-py's asyncio client spends about 0.2 ms of Python per
command (pool checkout, retry wrapper, stream reader), two thirds of the limiter's 0.3 ms budget.
This connection writes each command the moment it is issued and matches replies in order (Redis
answers one connection's commands first in, first out), so concurrent requests share one socket
with no pool and no lock; a command costs about 0.05-0.07 ms of CPU. It speaks only what the
gateway needs: RESP2 replies, the URL's credentials and database, TLS for `rediss://`, and
scripts by SHA1 with an EVAL fallback.

Failures raise redis-py's exception types, so callers handle them as for any Redis client.
A failed connect opens a breaker: until a reconnect succeeds, commands fail at once without
touching the network, and at most one reconnect per `reconnect_interval` runs in the background
(started by a command). So with Redis down, requests go on at once (auth asks identity, the
limiter fails open): none pays for, or queues behind, a connection attempt, even when Redis's
host drops packets and each attempt lasts the whole timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ssl
import time
from collections import deque
from typing import Any, cast

from redis.asyncio.connection import SSLConnection, parse_url
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.coalesced_writes import CoalescedWrites

Reply = int | bytes | None | ResponseError | list["Reply"]

CRLF = b"\r\n"


class LuaScript:
    """A script and the SHA1 Redis knows it by (EVALSHA)."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode(), usedforsecurity=False).hexdigest()


def encode_command(*args: str | int | bytes) -> bytes:
    """A command as a RESP array of bulk strings."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def parse_reply(buffer: bytes | bytearray, start: int) -> tuple[Reply, int] | None:
    """The reply that begins at `start` and where the next begins; None while incomplete.

    Error replies are returned (not raised) as ResponseError, in arrays too."""
    end = buffer.find(CRLF, start)
    if end < 0:
        return None
    kind = buffer[start]
    line = buffer[start + 1 : end]
    position = end + 2
    if kind == 0x3A:  # ':' integer
        return int(line), position
    if kind == 0x24:  # '$' bulk string
        size = int(line)
        if size < 0:
            return None, position
        if len(buffer) < position + size + 2:
            return None
        return bytes(buffer[position : position + size]), position + size + 2
    if kind == 0x2A:  # '*' array
        count = int(line)
        if count < 0:
            return None, position
        items: list[Reply] = []
        for _ in range(count):
            parsed = parse_reply(buffer, position)
            if parsed is None:
                return None
            item, position = parsed
            items.append(item)
        return items, position
    if kind == 0x2B:  # '+' simple string
        return bytes(line), position
    if kind == 0x2D:  # '-' error
        return ResponseError(bytes(line).decode(errors="replace")), position
    raise RedisConnectionError(f"unexpected reply type {chr(kind)!r} from Redis")


class _Pipeline(asyncio.Protocol):
    """The socket: writes commands as they come, resolves waiters in reply order.

    Each command has a deadline; one timer watches the oldest (replies come in order, so when
    it has its reply in time so had those before it). A reply overdue closes the connection:
    the replies after it would be out of step with their waiters. One timer per connection, not
    one per command, because arming and cancelling a timer for every command (asyncio.timeout)
    cost ~3% of the gateway's CPU per request."""

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._loop = asyncio.get_running_loop()
        self._buffer = bytearray()
        self._waiting: deque[tuple[asyncio.Future[Reply], float]] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # The commands of requests that reach Redis in one step of the loop go in one write
        # (and come back in one read): a system call and a TCP segment fewer each.
        coalesced: Any = CoalescedWrites(cast(asyncio.Transport, transport), self._loop)
        self._transport = coalesced

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        position = 0
        try:
            while (parsed := parse_reply(buffer, position)) is not None:
                reply, position = parsed
                if self._waiting:
                    waiter, _ = self._waiting.popleft()
                    if not waiter.done():  # its caller was cancelled: the reply is dropped
                        waiter.set_result(reply)
        except RedisConnectionError as exc:
            self._fail(exc)
            return
        if position:
            del buffer[:position]

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(RedisConnectionError(f"connection to Redis lost: {exc or 'closed'}"))

    def send(self, command: bytes, timeout: float) -> asyncio.Future[Reply]:
        """The reply to `command`, or RedisTimeoutError when none came within `timeout`
        seconds."""
        if self.closed or self._transport is None:
            raise RedisConnectionError("connection to Redis closed")
        waiter: asyncio.Future[Reply] = self._loop.create_future()
        deadline = self._loop.time() + timeout
        self._waiting.append((waiter, deadline))
        if self._timer is None:
            self._timer = self._loop.call_at(deadline, self._check_deadline)
        self._transport.write(command)
        return waiter

    def close(self) -> None:
        self._fail(RedisConnectionError("connection to Redis closed"))

    def _check_deadline(self) -> None:
        self._timer = None
        if self.closed or not self._waiting:
            return
        now = self._loop.time()
        waiter, deadline = self._waiting[0]
        if deadline > now:  # the command it was set for was answered: watch the oldest now
            self._timer = self._loop.call_at(deadline, self._check_deadline)
            return
        while self._waiting and self._waiting[0][1] <= now:
            waiter, deadline = self._waiting.popleft()
            if not waiter.done():
                waiter.set_exception(RedisTimeoutError("no reply from Redis in time"))
        self.close()

    def _fail(self, error: Exception) -> None:
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._transport is not None:
            self._transport.abort()
        while self._waiting:
            waiter, _ = self._waiting.popleft()
            if not waiter.done():
                waiter.set_exception(error)


class PipelinedRedis:
    """Connects on first use and again after a failure (at most once per reconnect_interval)."""

    def __init__(self, url: str, *, timeout: float = 2.0, reconnect_interval: float = 1.0) -> None:
        self._options: dict[str, Any] = dict(parse_url(url))
        self._timeout = timeout
        self._reconnect_interval = reconnect_interval
        self._pipeline: _Pipeline | None = None
        self._connecting = asyncio.Lock()
        self._next_attempt = 0.0
        self._down = False  # the last connect failed: commands fail at once until one succeeds
        self._probe: asyncio.Task[None] | None = None

    async def run_script(self, script: LuaScript, keys: list[str], args: list[str | int]) -> Reply:
        """EVALSHA; EVAL when Redis does not have the script (first use, restart, flush)."""
        reply = await self.execute("EVALSHA", script.sha, len(keys), *keys, *args)
        if isinstance(reply, ResponseError) and str(reply).startswith("NOSCRIPT"):
            reply = await self.execute("EVAL", script.source, len(keys), *keys, *args)
        if isinstance(reply, ResponseError):
            raise reply
        return reply

    async def get(self, key: str) -> bytes | None:
        reply = await self.execute("GET", key)
        if isinstance(reply, ResponseError):
            raise reply
        return reply if isinstance(reply, bytes) else None

    async def ping(self) -> None:
        reply = await self.execute("PING")
        if isinstance(reply, ResponseError):
            raise reply

    async def execute(self, *args: str | int | bytes) -> Reply:
        """One command's reply; an error reply is returned, a broken connection raised."""
        pipeline = self._pipeline
        if pipeline is None or pipeline.closed:
            pipeline = await self._connect()
        try:
            return await pipeline.send(encode_command(*args), self._timeout)
        except RedisTimeoutError as exc:  # the pipeline closed itself (see _Pipeline)
            raise RedisTimeoutError(f"no reply from Redis within {self._timeout} s") from exc

    async def close(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe
        if self._pipeline is not None:
            self._pipeline.close()
            self._pipeline = None

    async def _connect(self) -> _Pipeline:
        if self._down:
            self._reconnect_in_background()
            raise RedisConnectionError("Redis unreachable; reconnecting in the background")
        async with self._connecting:
            if self._pipeline is not None and not self._pipeline.closed:
                return self._pipeline
            if self._down:  # the attempt this call waited for failed
                raise RedisConnectionError("Redis unreachable; reconnecting in the background")
            return await self._attempt()

    def _reconnect_in_background(self) -> None:
        running = self._probe is not None and not self._probe.done()
        if running or time.monotonic() < self._next_attempt:
            return
        self._probe = asyncio.create_task(self._reconnect(), name="redis-reconnect")

    async def _reconnect(self) -> None:
        async with self._connecting:
            with contextlib.suppress(RedisConnectionError):  # still down: the breaker stays open
                await self._attempt()

    async def _attempt(self) -> _Pipeline:
        """One connect and handshake; opens the breaker when it fails, closes it when not."""
        pipeline: _Pipeline | None = None
        try:
            async with asyncio.timeout(self._timeout):
                pipeline = await self._open()
                await self._handshake(pipeline)
        except (OSError, TimeoutError, RedisConnectionError, ResponseError) as exc:
            if pipeline is not None:
                pipeline.close()
            self._down = True
            self._next_attempt = time.monotonic() + self._reconnect_interval
            raise RedisConnectionError(f"cannot connect to Redis: {exc}") from exc
        self._pipeline = pipeline
        self._down = False
        return pipeline

    async def _open(self) -> _Pipeline:
        loop = asyncio.get_running_loop()
        options = self._options
        if "path" in options:
            _, unix = await loop.create_unix_connection(_Pipeline, options["path"])
            return unix
        _, tcp = await loop.create_connection(
            _Pipeline,
            options.get("host", "localhost"),
            options.get("port", 6379),
            ssl=self._tls(),
        )
        return tcp

    def _tls(self) -> ssl.SSLContext | None:
        connection_class = self._options.get("connection_class")
        if connection_class is None or not issubclass(connection_class, SSLConnection):
            return None
        context = ssl.create_default_context()
        if self._options.get("ssl_cert_reqs") in ("none", ssl.CERT_NONE):
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context

    async def _handshake(self, pipeline: _Pipeline) -> None:
        options = self._options
        commands: list[bytes] = []
        if options.get("password"):
            username = options.get("username")
            auth = (username, options["password"]) if username else (options["password"],)
            commands.append(encode_command("AUTH", *auth))
        if options.get("db"):
            commands.append(encode_command("SELECT", int(options["db"])))
        sent = (pipeline.send(command, self._timeout) for command in commands)
        for reply in await asyncio.gather(*sent):
            if isinstance(reply, ResponseError):
                pipeline.close()
                raise reply

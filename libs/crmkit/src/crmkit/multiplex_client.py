"""The client end of the multiplexed stream (crm.mux.v1.Multiplexer/Exchange): a unary call sent
as a CALL frame on one of a few long-lived streams of the channel, its REPLY read back by the
stream's reader. A call answers what the same unary call answers: the response, or an
AioRpcError with the status code, details and trailing metadata the server's handler gave
(google.rpc details included), DEADLINE_EXCEEDED when its deadline passes first, UNAVAILABLE
when the stream fails under it; a cancelled caller sends CANCEL.

STREAMS streams per channel, each opened when first needed on whichever connection the
channel's round-robin policy picks (replicas share the calls), and replaced when the server
sends DRAIN or the stream ends. Frames are written once the server's initial metadata names it
a multiplexer (`multiplex.SERVING`, sent as the stream opens); a server that does not serve
Exchange answers UNIMPLEMENTED instead, and the channel then makes its calls as plain unary
calls (`NotMultiplexed`).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
from typing import Any

import grpc

from crm.mux.v1 import mux_pb2
from crmkit.multiplex import (
    CALL,
    CANCEL,
    DRAIN,
    EXCHANGE,
    REPLY,
    SERVING,
    add_entries,
    metadata_of,
)

log = logging.getLogger("crmkit.multiplex")

STREAMS = 4
_CODES = {code.value[0]: code for code in grpc.StatusCode}


class NotMultiplexed(Exception):
    """The server does not serve Exchange: make the call as a plain unary call."""


class MultiplexedCalls:
    """The streams of one channel and the calls made over them."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._exchange = channel.stream_stream(
            EXCHANGE,
            request_serializer=mux_pb2.Frame.SerializeToString,
            response_deserializer=mux_pb2.Frame.FromString,
        )
        self._streams: list[_ClientStream | None] = [None] * STREAMS
        self._turn = itertools.cycle(range(STREAMS))
        self._ids = itertools.count(1)
        self.available = True  # False once the server answered UNIMPLEMENTED
        self._closed = False

    async def call(self, method: str, payload: bytes, timeout: float, metadata: Any) -> bytes:
        """The serialized response of `method`; raises as a unary call of it raises."""
        slot = next(self._turn)
        stream = self._streams[slot]
        if stream is None or not stream.open:
            stream = self._streams[slot] = _ClientStream(self, self._exchange())
        return await stream.call(next(self._ids), method, payload, timeout, metadata)

    def unimplemented(self) -> None:
        if self.available:
            self.available = False
            log.info("the server does not multiplex calls: plain unary calls on this channel")

    async def close(self, grace: float | None) -> None:
        """Waits `grace` seconds at most for the calls in flight, then cancels what is left."""
        self._closed = True
        streams = [stream for stream in self._streams if stream is not None]
        if grace:
            pending = [f for stream in streams for f in stream.pending.values() if not f.done()]
            if pending:
                await asyncio.wait(pending, timeout=grace)
        for stream in streams:
            stream.cancel()


class _ClientStream:
    def __init__(self, owner: MultiplexedCalls, call: Any) -> None:
        self._owner = owner
        self._call = call
        self.pending: dict[int, asyncio.Future[mux_pb2.Frame]] = {}
        self.open = True  # new calls may be sent (no DRAIN, no end yet)
        self._outbox: collections.deque[mux_pb2.Frame] = collections.deque()
        self._wake: asyncio.Future[None] | None = None
        self._done_writing = False
        self._writer = asyncio.create_task(self._write())
        self._reader = asyncio.create_task(self._read())

    async def call(
        self, frame_id: int, method: str, payload: bytes, timeout: float, metadata: Any
    ) -> bytes:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[mux_pb2.Frame] = loop.create_future()
        self.pending[frame_id] = future
        frame = mux_pb2.Frame(
            kind=CALL, id=frame_id, method=method, payload=payload, timeout=timeout
        )
        add_entries(frame, metadata)
        self._send(frame)
        # A timer on the future, not asyncio.timeout: no cancel and uncancel of the task.
        expiry = loop.call_later(timeout, _expire, future)
        try:
            reply = await future
        except _Expired:
            self._send(mux_pb2.Frame(kind=CANCEL, id=frame_id))
            raise _error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None
        except asyncio.CancelledError:
            if future.cancelled():  # no reply came (the caller's cancel cancels the future)
                self._send(mux_pb2.Frame(kind=CANCEL, id=frame_id))
            raise
        finally:
            expiry.cancel()
            del self.pending[frame_id]
            if not self.open:
                self._close_if_drained()
        if reply.code == 0:
            return reply.payload
        raise _error(_CODES.get(reply.code, grpc.StatusCode.UNKNOWN), reply.details, reply.metadata)

    def cancel(self) -> None:
        self.open = False
        self._call.cancel()

    def _send(self, frame: mux_pb2.Frame) -> None:
        if self._done_writing:
            return
        self._outbox.append(frame)
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(None)

    async def _write(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            if SERVING not in tuple(await self._call.initial_metadata()):
                return  # no Exchange here: the reader reports the server's UNIMPLEMENTED
            while True:
                while self._outbox:
                    await self._call.write(self._outbox.popleft())
                if self._done_writing:
                    await self._call.done_writing()
                    return
                self._wake = loop.create_future()
                await self._wake
        except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError):
            return  # the stream ended: its reader fails the calls

    async def _read(self) -> None:
        ended: grpc.aio.AioRpcError | None = None  # None: cancelled (the channel closes)
        try:
            while True:
                frame = await self._call.read()
                if frame is grpc.aio.EOF:
                    ended = _error(grpc.StatusCode.UNAVAILABLE, "the stream ended")
                    break
                if frame.kind == REPLY:
                    future = self.pending.get(frame.id)
                    if future is not None and not future.done():
                        future.set_result(frame)
                elif frame.kind == DRAIN:
                    self.open = False
                    self._close_if_drained()
        except grpc.aio.AioRpcError as exc:
            ended = exc
        except asyncio.CancelledError:
            ended = None
        finally:
            self.open = False
            self._fail_pending(ended)

    def _close_if_drained(self) -> None:
        """After DRAIN, the client's side closes once no call waits on this stream."""
        if not self.open and not self.pending and not self._done_writing:
            self._done_writing = True
            wake = self._wake
            if wake is not None and not wake.done():
                wake.set_result(None)

    def _fail_pending(self, status: grpc.aio.AioRpcError | None) -> None:
        unimplemented = status is not None and status.code() == grpc.StatusCode.UNIMPLEMENTED
        if unimplemented:
            self._owner.unimplemented()
        for future in self.pending.values():
            if future.done():
                continue
            if unimplemented:
                future.set_exception(NotMultiplexed())
            elif status is None:
                future.cancel()
            else:
                future.set_exception(
                    _error(grpc.StatusCode.UNAVAILABLE, f"stream ended: {status.details()}")
                )
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(None)
        self._done_writing = True


class _Expired(Exception):
    """The call's deadline passed before its reply came."""


def _expire(future: asyncio.Future[mux_pb2.Frame]) -> None:
    if not future.done():
        future.set_exception(_Expired())


def _error(code: grpc.StatusCode, details: str, trailing: Any = ()) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(
        code, grpc.aio.Metadata(), grpc.aio.Metadata(*metadata_of(trailing)), details, None
    )

"""The server end of the multiplexed stream (crm.mux.v1.Multiplexer/Exchange): each CALL frame
runs the method's unary handler, the very one a plain call of the method runs (wrapped by
crmkit.server_calls: span, metrics, errors to a status), with a servicer context of the frame,
and its outcome goes back as a REPLY frame. Frames run concurrently; replies are written by one
writer, in the order they finish.

A stream lives GRPC_MAX_CONNECTION_AGE at most, as a connection does: then, and when the server
stops, the server sends DRAIN; the client opens a new stream for further calls (so a scale-up's
new replicas get calls, as with connections) and closes its side, and the server ends the
stream once the calls it has are answered.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import logging
import time
from collections.abc import Callable, Sequence
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

Resolve = Callable[[str, tuple[tuple[str, str | bytes], ...]], grpc.RpcMethodHandler | None]


class _Details:
    """What a generic handler is asked with (grpc.HandlerCallDetails)."""

    def __init__(self, method: str, invocation_metadata: Any) -> None:
        self.method = method
        self.invocation_metadata = invocation_metadata


def resolver(served: Sequence[grpc.GenericRpcHandler]) -> Resolve:
    """The method handler the first of `served` answers, as the server's own lookup does."""

    def resolve(
        method: str, metadata: tuple[tuple[str, str | bytes], ...]
    ) -> grpc.RpcMethodHandler | None:
        details = _Details(method, metadata)
        for generic in served:
            handler = generic.service(details)
            if handler is not None:
                return handler
        return None

    return resolve


class FrameContext:
    """The servicer context of one CALL frame: what the services' handlers use of grpc.aio's."""

    __slots__ = ("_code", "_deadline", "_details", "_metadata", "_peer", "_trailing")

    def __init__(self, metadata: tuple[tuple[str, str | bytes], ...], timeout: float, peer: str):
        self._metadata = metadata
        self._deadline = time.monotonic() + timeout if timeout > 0 else None
        self._peer = peer
        self._code: grpc.StatusCode | None = None
        self._details = ""
        self._trailing: tuple[tuple[str, str | bytes], ...] = ()

    def invocation_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        return self._metadata

    def time_remaining(self) -> float | None:
        if self._deadline is None:
            return None
        return max(self._deadline - time.monotonic(), 0.0)

    def peer(self) -> str:
        return self._peer

    async def abort(
        self, code: grpc.StatusCode, details: str = "", trailing_metadata: Sequence[Any] = ()
    ) -> None:
        self._code = code
        self._details = details
        if trailing_metadata:
            self._trailing = tuple(trailing_metadata)
        raise grpc.aio.AbortError("Locally aborted.")

    async def abort_with_status(self, status: Any) -> None:
        await self.abort(status.code, status.details, status.trailing_metadata)

    def set_code(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode | None:
        return self._code

    def set_details(self, details: str) -> None:
        self._details = details

    def details(self) -> str:
        return self._details

    def set_trailing_metadata(self, metadata: Sequence[Any]) -> None:
        self._trailing = tuple(metadata)

    def trailing_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        return self._trailing

    def reply(self, frame_id: int) -> mux_pb2.Frame:
        """The REPLY of a call that ended without a response (aborted, or a status set)."""
        code = self._code or grpc.StatusCode.UNKNOWN
        frame = mux_pb2.Frame(kind=REPLY, id=frame_id, code=code.value[0], details=self._details)
        add_entries(frame, self._trailing)
        return frame


class Multiplexer:
    """Serves Exchange over the methods `resolve` finds (the server's generic handlers).
    `concurrency` bounds the frames running at once, over all streams, as the server's
    maximum_concurrent_rpcs bounds calls: a frame beyond it is answered RESOURCE_EXHAUSTED."""

    def __init__(self, resolve: Resolve, lifetime: float, concurrency: int | None = None) -> None:
        self._resolve = resolve
        self._lifetime = lifetime
        self._handlers: dict[str, grpc.RpcMethodHandler | None] = {}
        self._streams: set[_ServerStream] = set()
        self.concurrency = concurrency
        self.running = 0

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            EXCHANGE.split("/")[1],
            {
                EXCHANGE.split("/")[2]: grpc.stream_stream_rpc_method_handler(
                    self._exchange,
                    request_deserializer=mux_pb2.Frame.FromString,
                    response_serializer=mux_pb2.Frame.SerializeToString,
                )
            },
        )

    def drain(self) -> None:
        """DRAIN to every open stream (the server is stopping): their clients open new streams
        for further calls; the calls they have are still answered."""
        for stream in list(self._streams):
            stream.drain()

    def unary_handler(
        self, method: str, metadata: tuple[tuple[str, str | bytes], ...]
    ) -> grpc.RpcMethodHandler | None:
        if method in self._handlers:
            return self._handlers[method]
        handler = self._resolve(method, metadata)
        if handler is not None and handler.unary_unary is None:
            handler = None  # streaming methods are called as themselves
        self._handlers[method] = handler
        return handler

    async def _exchange(self, requests: Any, context: grpc.aio.ServicerContext) -> Any:
        """The stream's replies, in the order they are ready; ends once the client has closed
        its side and every call it sent is answered."""
        loop = asyncio.get_running_loop()
        await context.send_initial_metadata((SERVING,))
        stream = _ServerStream(self, context)
        self._streams.add(stream)
        reader = asyncio.create_task(stream.read(requests))
        timer = loop.call_later(self._lifetime, stream.drain)
        replies = stream.replies
        try:
            while True:
                while replies:
                    reply = replies.popleft()
                    if reply is None:
                        return
                    yield reply
                stream.wake = loop.create_future()
                await stream.wake
        finally:
            timer.cancel()
            reader.cancel()
            stream.cancel_running()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
            self._streams.discard(stream)


class _ServerStream:
    def __init__(self, multiplexer: Multiplexer, context: grpc.aio.ServicerContext) -> None:
        self._multiplexer = multiplexer
        self._peer = context.peer()
        self.replies: collections.deque[mux_pb2.Frame | None] = collections.deque()
        self.wake: asyncio.Future[None] | None = None
        self._running: dict[int, asyncio.Task[None]] = {}
        self._drained = False
        self._reading_done = False

    def drain(self) -> None:
        if not self._drained:
            self._drained = True
            self._reply(mux_pb2.Frame(kind=DRAIN))

    def cancel_running(self) -> None:
        for task in list(self._running.values()):
            task.cancel()

    def _reply(self, frame: mux_pb2.Frame | None) -> None:
        self.replies.append(frame)
        wake = self.wake
        if wake is not None and not wake.done():
            wake.set_result(None)

    async def read(self, requests: Any) -> None:
        try:
            async for frame in requests:
                if frame.kind == CALL:
                    task = asyncio.create_task(self._call(frame))
                    self._running[frame.id] = task
                elif frame.kind == CANCEL:
                    running = self._running.get(frame.id)
                    if running is not None:
                        running.cancel()
        finally:
            self._reading_done = True
            self._finish_if_done()

    def _finish_if_done(self) -> None:
        if self._reading_done and not self._running:
            self._reply(None)

    async def _call(self, frame: mux_pb2.Frame) -> None:
        multiplexer = self._multiplexer
        multiplexer.running += 1
        try:
            limit = multiplexer.concurrency
            if limit is not None and multiplexer.running > limit:
                reply = _status(
                    frame.id, grpc.StatusCode.RESOURCE_EXHAUSTED, "Concurrent RPC limit exceeded!"
                )
            else:
                reply = await self._answer(frame)
            self._reply(reply)
        finally:
            multiplexer.running -= 1
            self._running.pop(frame.id, None)
            self._finish_if_done()

    async def _answer(self, frame: mux_pb2.Frame) -> mux_pb2.Frame:
        metadata = metadata_of(frame.metadata)
        handler = self._multiplexer.unary_handler(frame.method, metadata)
        if handler is None:
            return _status(frame.id, grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
        context = FrameContext(metadata, frame.timeout, self._peer)
        try:
            async with asyncio.timeout(frame.timeout if frame.timeout > 0 else None):
                request = frame.payload
                if handler.request_deserializer is not None:
                    request = handler.request_deserializer(request)
                response = handler.unary_unary(request, context)
                if inspect.isawaitable(response):
                    response = await response
        except grpc.aio.AbortError:
            return context.reply(frame.id)
        except TimeoutError:
            return _status(frame.id, grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        except Exception as exc:  # a handler that is not wrapped (errors are statuses there)
            log.exception("unhandled error in %s", frame.method)
            return _status(frame.id, grpc.StatusCode.UNKNOWN, f"Unexpected {type(exc)}: {exc}")
        if context.code() not in (None, grpc.StatusCode.OK):
            return context.reply(frame.id)
        payload = response
        if handler.response_serializer is not None:
            payload = handler.response_serializer(response)
        return mux_pb2.Frame(kind=REPLY, id=frame.id, payload=payload)


def _status(frame_id: int, code: grpc.StatusCode, details: str) -> mux_pb2.Frame:
    return mux_pb2.Frame(kind=REPLY, id=frame_id, code=code.value[0], details=details)

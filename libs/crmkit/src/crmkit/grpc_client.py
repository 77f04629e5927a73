"""Long-lived gRPC channels to peers, one per upstream, with deadlines on every call.

Every unary call made through a channel of `open_channel` gets the channel's default deadline
when it has none and carries the current trace context in its metadata; inside a recorded trace
it is a CLIENT span. This is done by wrapping the channel's callables rather than with a grpc.aio
client interceptor: an interceptor runs every call through an extra task and call object, which
cost more CPU than the rest of the client side of a call (measured, docs/benchmarks.md).

A unary call is made on grpc.aio's own Cython call (`_LeanUnary`): what grpc.aio's
UnaryUnaryCall does around it (a task per call, a call object, a Metadata object, the
channel's weak set of calls) is not done, as no caller here uses the call object; only its
response or its AioRpcError, raised as grpc.aio raises it (docs/decisions.md, "The gRPC
client's unary call"). On a channel opened `multiplexed`, it is sent as a frame on one of the
channel's long-lived streams instead (crmkit.multiplex_client; docs/decisions.md, "Unary calls
over one stream"), unless the server does not serve them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from grpc._cython import cygrpc
from grpc.aio._call import _create_rpc_error
from opentelemetry import trace

from crmkit.multiplex_client import MultiplexedCalls, NotMultiplexed
from crmkit.telemetry import metadata_from_context

_tracer = trace.get_tracer("crmkit.grpc")

KEEPALIVE_TIME = 30.0  # seconds; GRPC_KEEPALIVE_TIME


def channel_options(keepalive_time: float = KEEPALIVE_TIME) -> list[tuple[str, int | str]]:
    """Options of every channel. Keepalive pings (every `keepalive_time`, also while idle) let
    an idle channel notice a dead peer; servers accept them (crmkit.grpc_server.server_options
    with the same setting), else they would answer GOAWAY `too_many_pings`. Retries stay off:
    services handle idempotency."""
    return [
        ("grpc.keepalive_time_ms", round(keepalive_time * 1000)),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.max_receive_message_length", 64 * 1024 * 1024),
        ("grpc.max_send_message_length", 64 * 1024 * 1024),
        ("grpc.enable_retries", 0),
        # A restarted peer is used again within a second: gRPC's default reconnect backoff grows
        # towards 120 s, and calls fail fast with UNAVAILABLE meanwhile although the peer is back.
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1000),
        # Spread calls over every address a target resolves to (replicas), not just the first.
        ("grpc.service_config", '{"loadBalancingConfig": [{"round_robin": {}}]}'),
    ]


class _LeanUnary:
    """A unary call of a grpc.aio UnaryUnaryMultiCallable made directly on its Cython call."""

    __slots__ = (
        "_channel",
        "_deserialize",
        "_handle",
        "_in_flight",
        "_method",
        "_method_name",
        "_multiplexed",
        "_serialize",
    )

    def __init__(
        self, inner: Any, in_flight: set[Any], multiplexed: MultiplexedCalls | None
    ) -> None:
        self._channel = inner._channel
        self._method = inner._method
        self._method_name = inner._method.decode()
        self._handle = inner._registered_call_handle
        self._serialize = inner._request_serializer
        self._deserialize = inner._response_deserializer
        self._in_flight = in_flight
        self._multiplexed = multiplexed

    @classmethod
    def of(
        cls, inner: Any, in_flight: set[Any], multiplexed: MultiplexedCalls | None
    ) -> _LeanUnary | None:
        """None when `inner` is not grpc.aio's plain callable (interceptors, another class)."""
        if type(inner) is not grpc.aio._channel.UnaryUnaryMultiCallable or inner._interceptors:
            return None
        return cls(inner, in_flight, multiplexed)

    async def __call__(self, request: Any, timeout: float, metadata: Any) -> Any:
        serialized = request if self._serialize is None else self._serialize(request)
        multiplexed = self._multiplexed
        if multiplexed is not None and multiplexed.available:
            try:
                response = await multiplexed.call(self._method_name, serialized, timeout, metadata)
            except NotMultiplexed:
                pass  # the server answered UNIMPLEMENTED before running the call
            else:
                return response if self._deserialize is None else self._deserialize(response)
        call = self._channel.call(self._method, time.time() + timeout, None, None, self._handle)
        self._in_flight.add(call)
        try:
            response = await call.unary_unary(
                serialized, tuple(metadata), cygrpc.build_census_context()
            )
        except asyncio.CancelledError:
            if not call.done():
                call.cancel(_CANCELLED)
            raise
        finally:
            self._in_flight.discard(call)
        if call.is_ok():
            return response if self._deserialize is None else self._deserialize(response)
        if call.is_locally_cancelled():
            raise asyncio.CancelledError()
        raise _create_rpc_error(call._initial_metadata, call._status)


_CANCELLED = "Locally cancelled by application!"  # grpc.aio's details of a local cancel


class UnaryCall:
    """A unary method of a peer: `await method(request, metadata=...)` as with grpc.aio, plus
    the default deadline and the trace context."""

    __slots__ = ("_inner", "_lean", "_name", "_timeout")

    def __init__(
        self,
        inner: Any,
        name: str,
        default_timeout: float,
        in_flight: set[Any],
        multiplexed: MultiplexedCalls | None = None,
    ) -> None:
        self._inner = inner
        self._name = name.lstrip("/")
        self._timeout = default_timeout
        self._lean = _LeanUnary.of(inner, in_flight, multiplexed)  # None: grpc.aio's call

    def __call__(
        self,
        request: Any,
        *,
        timeout: float | None = None,
        metadata: Any = None,
        credentials: Any = None,
        wait_for_ready: bool | None = None,
        compression: Any = None,
    ) -> Any:
        """The call (awaitable to the response); inside a recorded trace, a coroutine that
        keeps the CLIENT span open until the response (or error) arrives."""
        deadline = self._timeout if timeout is None else timeout
        if trace.get_current_span().is_recording():
            # the call is made inside the span, so its metadata carries the span's context
            return self._traced(
                lambda: self._send(
                    request, deadline, metadata, credentials, wait_for_ready, compression
                )
            )
        return self._send(request, deadline, metadata, credentials, wait_for_ready, compression)

    def _send(
        self,
        request: Any,
        deadline: float,
        metadata: Any,
        credentials: Any,
        wait_for_ready: bool | None,
        compression: Any,
    ) -> Any:
        lean = self._lean
        plain = credentials is None and wait_for_ready is None and compression is None
        if lean is not None and plain:
            return lean(request, deadline, _with_trace(metadata))
        return self._inner(
            request,
            timeout=deadline,
            metadata=_with_trace(metadata),
            credentials=credentials,
            wait_for_ready=wait_for_ready,
            compression=compression,
        )

    async def _traced(self, send: Callable[[], Awaitable[Any]]) -> Any:
        with _tracer.start_as_current_span(
            self._name, kind=trace.SpanKind.CLIENT, attributes={"rpc.system": "grpc"}
        ):
            return await send()


def _with_trace(metadata: Any) -> list[tuple[str, str | bytes]]:
    carried = metadata_from_context()
    if not metadata:
        return carried  # type: ignore[return-value]
    return [*metadata, *carried]


class Channel:
    """A grpc.aio channel whose unary methods are `UnaryCall`s (stubs take it as a channel).
    Closing it cancels the unary calls still in flight, as grpc.aio's close does its own.
    `multiplexed`: unary calls go as frames over the channel's streams (crmkit.multiplex_client)."""

    def __init__(
        self, inner: grpc.aio.Channel, default_timeout: float, *, multiplexed: bool = False
    ) -> None:
        self.inner = inner
        self._timeout = default_timeout
        self._in_flight: set[Any] = set()  # Cython calls of the UnaryCalls
        self._multiplexed = MultiplexedCalls(inner) if multiplexed else None

    def unary_unary(self, method: str, *args: Any, **kwargs: Any) -> UnaryCall:
        callable_ = self.inner.unary_unary(method, *args, **kwargs)
        return UnaryCall(callable_, method, self._timeout, self._in_flight, self._multiplexed)

    def unary_stream(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self.inner.unary_stream(method, *args, **kwargs)

    def stream_unary(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self.inner.stream_unary(method, *args, **kwargs)

    def stream_stream(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self.inner.stream_stream(method, *args, **kwargs)

    def get_state(self, try_to_connect: bool = False) -> Any:
        return self.inner.get_state(try_to_connect)

    async def wait_for_state_change(self, last_observed_state: Any) -> None:
        await self.inner.wait_for_state_change(last_observed_state)

    async def channel_ready(self) -> None:
        await self.inner.channel_ready()

    async def close(self, grace: float | None = None) -> None:
        if self._multiplexed is not None:
            await self._multiplexed.close(grace)
        if grace:
            await self._settled(grace)
        for call in list(self._in_flight):
            if not call.done():
                call.cancel(_CANCELLED)
        self._in_flight.clear()
        await self.inner.close(grace)

    async def _settled(self, grace: float) -> None:
        """Until the unary calls in flight are done, `grace` seconds at most."""
        statuses = [
            asyncio.ensure_future(call.status()) for call in self._in_flight if not call.done()
        ]
        if statuses:
            await asyncio.wait(statuses, timeout=grace)

    async def __aenter__(self) -> Channel:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


# For channels that stream large responses (exports): a fixed per-stream receive window instead
# of one grown by bandwidth-delay probing, which let a gateway hold tens of MB of an export it
# could not pass on yet (measured: +58 MB for an 80 MB export read slowly).
STREAMING_OPTIONS: list[tuple[str, int | str]] = [
    ("grpc.http2.bdp_probe", 0),
    ("grpc.http2.lookahead_bytes", 4 * 1024 * 1024),
]


def open_channel(
    address: str,
    default_timeout: float,
    keepalive_time: float = KEEPALIVE_TIME,
    extra_options: list[tuple[str, int | str]] | None = None,
    *,
    multiplexed: bool = False,
) -> Channel:
    """An insecure channel (traffic stays inside the cluster network) to `address`;
    `multiplexed` for a peer that is one of the services (crmkit.grpc_server serves the
    multiplexed stream), whose unary calls then go as frames over long-lived streams."""
    options = channel_options(keepalive_time) + (extra_options or [])
    inner = grpc.aio.insecure_channel(address, options=options)
    return Channel(inner, default_timeout, multiplexed=multiplexed)

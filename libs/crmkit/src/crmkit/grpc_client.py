"""Long-lived gRPC channels to peers, one per upstream, with deadlines on every call.

Every unary call made through a channel of `open_channel` gets the channel's default deadline
when it has none and carries the current trace context in its metadata; inside a recorded trace
it is a CLIENT span. This is done by wrapping the channel's callables rather than with a grpc.aio
client interceptor: an interceptor runs every call through an extra task and call object, which
cost more CPU than the rest of the client side of a call (measured, docs/benchmarks.md).
"""

from __future__ import annotations

from typing import Any

import grpc
from opentelemetry import trace

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


class UnaryCall:
    """A unary method of a peer: `await method(request, metadata=...)` as with grpc.aio, plus
    the default deadline and the trace context."""

    __slots__ = ("_inner", "_name", "_timeout")

    def __init__(self, inner: Any, name: str, default_timeout: float) -> None:
        self._inner = inner
        self._name = name.lstrip("/")
        self._timeout = default_timeout

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
            return self._traced(
                request, deadline, metadata, credentials, wait_for_ready, compression
            )
        return self._inner(
            request,
            timeout=deadline,
            metadata=_with_trace(metadata),
            credentials=credentials,
            wait_for_ready=wait_for_ready,
            compression=compression,
        )

    async def _traced(
        self,
        request: Any,
        deadline: float,
        metadata: Any,
        credentials: Any,
        wait_for_ready: bool | None,
        compression: Any,
    ) -> Any:
        with _tracer.start_as_current_span(
            self._name, kind=trace.SpanKind.CLIENT, attributes={"rpc.system": "grpc"}
        ):
            return await self._inner(
                request,
                timeout=deadline,
                metadata=_with_trace(metadata),
                credentials=credentials,
                wait_for_ready=wait_for_ready,
                compression=compression,
            )


def _with_trace(metadata: Any) -> list[tuple[str, str | bytes]]:
    carried = metadata_from_context()
    if not metadata:
        return carried  # type: ignore[return-value]
    return [*metadata, *carried]


class Channel:
    """A grpc.aio channel whose unary methods are `UnaryCall`s (stubs take it as a channel)."""

    def __init__(self, inner: grpc.aio.Channel, default_timeout: float) -> None:
        self.inner = inner
        self._timeout = default_timeout

    def unary_unary(self, method: str, *args: Any, **kwargs: Any) -> UnaryCall:
        return UnaryCall(self.inner.unary_unary(method, *args, **kwargs), method, self._timeout)

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
        await self.inner.close(grace)

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
) -> Channel:
    """An insecure channel (traffic stays inside the cluster network) to `address`."""
    options = channel_options(keepalive_time) + (extra_options or [])
    return Channel(grpc.aio.insecure_channel(address, options=options), default_timeout)

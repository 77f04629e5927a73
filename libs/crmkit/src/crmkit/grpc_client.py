"""Long-lived gRPC channels to peers, one per upstream, with deadlines on every call."""

from __future__ import annotations

import grpc

from crmkit.interceptors import ClientInterceptor

# Keepalive so idle channels notice dead peers; retries stay off: services handle idempotency.
CHANNEL_OPTIONS: list[tuple[str, int | str]] = [
    ("grpc.keepalive_time_ms", 30_000),
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


def open_channel(address: str, default_timeout: float) -> grpc.aio.Channel:
    """An insecure channel (traffic stays inside the cluster network) to `address`."""
    return grpc.aio.insecure_channel(
        address,
        options=CHANNEL_OPTIONS,
        interceptors=[ClientInterceptor(default_timeout)],
    )

"""Metrics every gRPC process exposes, and the /metrics HTTP server on its own port.

Each process defines its other metrics in its own `metrics.py`; names follow Prometheus
conventions and labels carry method names or route templates, never ids.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


@dataclass(frozen=True)
class GrpcServerMetrics:
    requests: Counter
    duration: Histogram
    in_flight: Gauge

    @classmethod
    def create(cls, registry: CollectorRegistry) -> GrpcServerMetrics:
        return cls(
            requests=Counter(
                "grpc_server_handled_total",
                "gRPC calls handled, by method and status code.",
                ["grpc_service", "grpc_method", "grpc_code"],
                registry=registry,
            ),
            duration=Histogram(
                "grpc_server_handling_seconds",
                "Time to handle a gRPC call.",
                ["grpc_service", "grpc_method"],
                buckets=LATENCY_BUCKETS,
                registry=registry,
            ),
            in_flight=Gauge(
                "grpc_server_in_flight",
                "gRPC calls being handled.",
                registry=registry,
            ),
        )


def start_metrics_server(registry: CollectorRegistry, host: str, port: int) -> int:
    """Serve `registry` at http://host:port/metrics in a thread; return the bound port."""
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return int(server.server_port)

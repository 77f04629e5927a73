"""Metrics every gRPC process exposes, and the /metrics HTTP server on its own port.

Each process defines its other metrics in its own `metrics.py`; names follow Prometheus
conventions and labels carry method names or route templates, never ids.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)

MetricT = TypeVar("MetricT", Counter, Gauge, Histogram)


class Children(Generic[MetricT]):
    """A labelled metric's children, each looked up once: prometheus_client's `labels()` takes a
    lock and checks the values on every call, a cost every request would pay. Only for label
    values from a fixed set (outcomes, methods, route templates): the children are kept."""

    __slots__ = ("_children", "_metric")

    def __init__(self, metric: MetricT) -> None:
        self._metric: MetricT = metric
        self._children: dict[tuple[str, ...], MetricT] = {}

    def __call__(self, *values: str) -> MetricT:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._metric.labels(*values)
        return child


@dataclass(frozen=True)
class GrpcServerMetrics:
    requests: Counter
    duration: Histogram
    in_flight: Gauge
    outages: Counter

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
            outages=Counter(
                "dependency_outages_total",
                "Outages of a dependency (database, nats, redis) this process saw: calls "
                "answered UNAVAILABLE or served degraded until it answered again.",
                ["dependency"],
                registry=registry,
            ),
        )


class SizedPool(Protocol):
    """What the pool collector reads of an asyncpg pool."""

    def get_size(self) -> int: ...
    def get_idle_size(self) -> int: ...
    def get_max_size(self) -> int: ...


class DbPoolCollector(Collector):
    """Connection pool gauges, sampled when Prometheus scrapes (no bookkeeping per query).

    `pools` maps a low-cardinality pool name (the service, or e.g. `webhooks-dispatch`) to its
    pool. In use = open minus idle: connections acquired by a caller right now.
    """

    def __init__(self, pools: Mapping[str, SizedPool]) -> None:
        self._pools = dict(pools)

    def describe(self) -> Iterable[Metric]:
        return self._families()

    def collect(self) -> Iterable[Metric]:
        families = self._families()
        opened, in_use, idle, limit = families
        for name, pool in self._pools.items():
            size, free = pool.get_size(), pool.get_idle_size()
            opened.add_metric([name], size)
            in_use.add_metric([name], max(size - free, 0))
            idle.add_metric([name], free)
            limit.add_metric([name], pool.get_max_size())
        return families

    @staticmethod
    def _families() -> list[GaugeMetricFamily]:
        return [
            GaugeMetricFamily(
                "db_pool_connections", "Connections the pool holds open.", labels=["pool"]
            ),
            GaugeMetricFamily(
                "db_pool_connections_in_use",
                "Connections acquired by a caller (running a query or a transaction).",
                labels=["pool"],
            ),
            GaugeMetricFamily(
                "db_pool_connections_idle", "Open connections waiting in the pool.", labels=["pool"]
            ),
            GaugeMetricFamily(
                "db_pool_connections_max", "Most connections the pool may open.", labels=["pool"]
            ),
        ]


def observe_pools(registry: CollectorRegistry, pools: Mapping[str, SizedPool]) -> None:
    """Expose the pools' gauges (`db_pool_*{pool}`) in `registry`."""
    registry.register(DbPoolCollector(pools))


def start_metrics_server(registry: CollectorRegistry, host: str, port: int) -> int:
    """Serve `registry` at http://host:port/metrics in a thread; return the bound port."""
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return int(server.server_port)

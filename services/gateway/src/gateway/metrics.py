"""Every metric the gateway process exposes, defined in one place."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from crmkit.metrics import LATENCY_BUCKETS


@dataclass(frozen=True)
class GatewayMetrics:
    registry: CollectorRegistry
    http_requests: Counter
    http_duration: Histogram
    credential_checks: Counter
    revocation_checks: Counter
    websocket_connections: Gauge
    websocket_operations: Counter
    subscriptions_open: Gauge
    subscription_events: Counter
    subscription_event_lag: Histogram
    subscription_overflows: Counter
    record_feed_resets: Counter
    rate_limit_rejections: Counter
    rate_limit_failures: Counter
    dependency_up: Gauge
    outages: Counter

    @classmethod
    def create(cls) -> GatewayMetrics:
        registry = CollectorRegistry()
        return cls(
            registry=registry,
            http_requests=Counter(
                "http_requests_total",
                "HTTP requests served, by route template, method and status.",
                ["route", "method", "status"],
                registry=registry,
            ),
            http_duration=Histogram(
                "http_request_duration_seconds",
                "Time to serve an HTTP request, by route template and method.",
                ["route", "method"],
                buckets=LATENCY_BUCKETS,
                registry=registry,
            ),
            credential_checks=Counter(
                "gateway_credential_checks_total",
                "Credential (revocation) checks, by where the answer came from (cache, identity) "
                "and outcome (ok or the refusal reason).",
                ["source", "outcome"],
                registry=registry,
            ),
            revocation_checks=Counter(
                "gateway_revocation_checks_total",
                "Lookups of a credential's revocation entry in Redis (one per authenticated "
                "request), by result: hit, miss (identity answers) or error (Redis unreachable; "
                "identity answers).",
                ["result"],
                registry=registry,
            ),
            websocket_connections=Gauge(
                "gateway_websocket_connections",
                "GraphQL WebSocket connections open on this process.",
                registry=registry,
            ),
            websocket_operations=Counter(
                "gateway_websocket_operations_total",
                "Operations started over GraphQL WebSockets (subscriptions opened, queries and "
                "mutations sent over a socket); the events a subscription streams are not counted.",
                registry=registry,
            ),
            subscriptions_open=Gauge(
                "gateway_subscriptions_open",
                "Record-event subscriptions open on this process.",
                registry=registry,
            ),
            subscription_events=Counter(
                "gateway_subscription_events_total",
                "Record events per subscription they concerned, by outcome: queued (for the "
                "subscriber), skipped (filter or record ownership), dropped (subscriber too slow).",
                ["outcome"],
                registry=registry,
            ),
            subscription_event_lag=Histogram(
                "gateway_subscription_event_lag_seconds",
                "Time from a record change's commit to its dispatch to this process's subscribers.",
                buckets=LATENCY_BUCKETS,
                registry=registry,
            ),
            subscription_overflows=Counter(
                "gateway_subscription_overflows_total",
                "Sockets closed because a subscriber did not keep up (its event queue was full).",
                registry=registry,
            ),
            record_feed_resets=Counter(
                "gateway_record_feed_resets_total",
                "Times the JetStream consumer of record events was recreated (NATS restart, "
                "missed heartbeats or a sequence gap), resuming after the last event seen.",
                registry=registry,
            ),
            rate_limit_rejections=Counter(
                "gateway_rate_limit_rejections_total",
                "Calls refused by the API rate limit (answered 429 / RATE_LIMIT_EXCEEDED).",
                registry=registry,
            ),
            rate_limit_failures=Counter(
                "gateway_rate_limit_failures_total",
                "Rate-limit checks that could not reach Redis; the call was admitted (fail open).",
                registry=registry,
            ),
            dependency_up=Gauge(
                "gateway_dependency_up",
                "1 when the dependency answered the last /healthz or /readyz check, else 0.",
                ["dependency"],
                registry=registry,
            ),
            outages=Counter(
                "dependency_outages_total",
                "Outages of a dependency this process saw (see crmkit.outages).",
                ["dependency"],
                registry=registry,
            ),
        )

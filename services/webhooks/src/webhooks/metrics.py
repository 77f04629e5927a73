"""Metrics of the webhooks service (beyond the gRPC server metrics every service has)."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

ATTEMPT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
EVENT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5, 30, 60, 300, 3600, 21600, 86400)


@dataclass(frozen=True)
class WebhooksMetrics:
    events: Counter
    events_skipped: Counter
    routes_loads: Counter
    deliveries_queued: Counter
    attempts: Counter
    attempt_duration: Histogram
    event_to_delivery: Histogram
    pending: Gauge
    in_flight: Gauge

    @classmethod
    def create(cls, registry: CollectorRegistry) -> WebhooksMetrics:
        return cls(
            events=Counter(
                "webhook_events_consumed_total",
                "Record events read from JetStream by the deliverer.",
                registry=registry,
            ),
            events_skipped=Counter(
                "webhook_events_skipped_total",
                "Record events acknowledged without a write: no active webhook wants them.",
                registry=registry,
            ),
            routes_loads=Counter(
                "webhook_routes_loads_total",
                "Loads of the intake's routes (which workspaces' webhooks want which operations): "
                "at start and after each webhook change.",
                registry=registry,
            ),
            deliveries_queued=Counter(
                "webhook_deliveries_queued_total",
                "Deliveries queued (an event matched an active webhook), redeliveries included.",
                registry=registry,
            ),
            attempts=Counter(
                "webhook_deliveries_total",
                "Delivery attempts by outcome: delivered (2xx), retry (failed, another attempt "
                "scheduled) or failed (no attempt left, or nothing can be sent: payload too "
                "large, secret unreadable). A refused target fails like any other error.",
                ["outcome"],
                registry=registry,
            ),
            attempt_duration=Histogram(
                "webhook_delivery_attempt_seconds",
                "Time from sending a delivery to its answer (or failure).",
                buckets=ATTEMPT_BUCKETS,
                registry=registry,
            ),
            event_to_delivery=Histogram(
                "webhook_event_to_delivery_seconds",
                "Time from the record change (commit) to its successful delivery.",
                buckets=EVENT_BUCKETS,
                registry=registry,
            ),
            pending=Gauge(
                "webhook_deliveries_pending",
                "Deliveries waiting for their first or next attempt (all replicas).",
                registry=registry,
            ),
            in_flight=Gauge(
                "webhook_attempts_in_flight",
                "Attempts this process is sending now.",
                registry=registry,
            ),
        )

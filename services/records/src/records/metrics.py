"""Metrics of the records service (beyond the gRPC server metrics every service has)."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


@dataclass(frozen=True)
class RecordsMetrics:
    migrations: Counter
    schema_loads: Counter
    outbox_pending: Gauge
    relay_lag: Gauge
    published: Counter
    skipped: Counter
    events_gated: Gauge
    pruned: Counter
    relay_active: Gauge
    history_pruned: Counter
    create_rows: Histogram

    @classmethod
    def create(cls, registry: CollectorRegistry) -> RecordsMetrics:
        return cls(
            migrations=Counter(
                "records_schema_migrations_total",
                "MigrateSchema calls, by outcome (applied, unchanged, already_applied).",
                ["outcome"],
                registry=registry,
            ),
            schema_loads=Counter(
                "records_schema_cache_loads_total",
                "Workspace data models loaded into the cache (first use or newer version).",
                registry=registry,
            ),
            outbox_pending=Gauge(
                "records_outbox_pending",
                "Outbox rows not yet published to JetStream (reported by the active relay): "
                "counted up to 10,000, beyond that the span of their sequences (an upper bound).",
                registry=registry,
            ),
            relay_lag=Gauge(
                "records_outbox_relay_lag_seconds",
                "Age of the next unpublished outbox row (the lowest sequence); 0 when none "
                "waits (active relay).",
                registry=registry,
            ),
            published=Counter(
                "records_outbox_published_total",
                "Outbox rows published to JetStream and acknowledged.",
                registry=registry,
            ),
            skipped=Counter(
                "records_outbox_skipped_total",
                "Outbox rows marked published without being published: their workspace had "
                "no interest (nobody listened to its events).",
                registry=registry,
            ),
            events_gated=Gauge(
                "records_events_gated",
                "1 when the active relay publishes only the events of workspaces with interest; "
                "0 when it publishes every event (RECORD_EVENTS_PUBLISH=all, or webhooks and "
                "workflows have not both synced their interest yet).",
                registry=registry,
            ),
            pruned=Counter(
                "records_outbox_pruned_total",
                "Published outbox rows deleted after OUTBOX_RETENTION.",
                registry=registry,
            ),
            relay_active=Gauge(
                "records_outbox_relay_active",
                "1 in the replica whose relay holds the lock and publishes, 0 in standbys.",
                registry=registry,
            ),
            history_pruned=Counter(
                "records_history_pruned_total",
                "Record history entries deleted after RECORD_HISTORY_RETENTION_DAYS.",
                registry=registry,
            ),
            create_rows=Histogram(
                "records_create_statement_rows",
                "Records written by each statement of single-record creates: more than 1 when "
                "creates of one caller and object that arrived together went in one statement "
                "(CREATE_GROUP_IN_FLIGHT).",
                buckets=(1, 2, 3, 4, 6, 8, 12, 16, 32, 64, 100),
                registry=registry,
            ),
        )

"""Metrics of the workflows service (beyond the gRPC server metrics every service has)."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

RUN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
TRIGGER_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 30, 60, 300, 3600)


@dataclass(frozen=True)
class WorkflowsMetrics:
    events: Counter
    runs_queued: Counter
    runs: Counter
    run_duration: Histogram
    trigger_to_request: Histogram
    in_flight: Gauge

    @classmethod
    def create(cls, registry: CollectorRegistry) -> WorkflowsMetrics:
        return cls(
            events=Counter(
                "workflow_events_consumed_total",
                "Record events read from JetStream by the runner.",
                registry=registry,
            ),
            runs_queued=Counter(
                "workflow_runs_queued_total",
                "Runs queued, by trigger: record (an event matched) or scheduled (a tick).",
                ["trigger"],
                registry=registry,
            ),
            runs=Counter(
                "workflow_runs_total",
                "Attempts of runs by resulting status: succeeded, failed (no attempts left or "
                "cannot be sent), retry (failed, another attempt scheduled); test runs included.",
                ["status"],
                registry=registry,
            ),
            run_duration=Histogram(
                "workflow_run_duration_seconds",
                "Time from sending a run's HTTP request to its answer (or failure).",
                buckets=RUN_BUCKETS,
                registry=registry,
            ),
            trigger_to_request=Histogram(
                "workflow_trigger_to_request_seconds",
                "Time from the trigger (record change committed, or tick due) to sending the "
                "first attempt.",
                buckets=TRIGGER_BUCKETS,
                registry=registry,
            ),
            in_flight=Gauge(
                "workflow_runs_in_flight",
                "HTTP actions this process is sending now.",
                registry=registry,
            ),
        )

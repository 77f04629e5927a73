"""Metrics of the metadata service (beyond the gRPC server metrics every service has)."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter


@dataclass(frozen=True)
class MetadataMetrics:
    changes: Counter
    repairs: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> MetadataMetrics:
        return cls(
            changes=Counter(
                "metadata_changes_total",
                "Data-model changes, by outcome (committed, refused, failed).",
                ["outcome"],
                registry=registry,
            ),
            repairs=Counter(
                "metadata_reconcile_repairs_total",
                "Workspaces whose records schema drifted and was repaired by the reconciler.",
                registry=registry,
            ),
        )

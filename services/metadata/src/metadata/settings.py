"""Settings of the metadata service, read once at start."""

from __future__ import annotations

from pydantic import Field

from crmkit.settings import DatabaseSettings, Duration, GrpcServiceSettings, NatsSettings


class MetadataSettings(GrpcServiceSettings, DatabaseSettings, NatsSettings):
    RECORDS_ADDR: str
    # How often the reconciler compares committed definitions with records' applied schema.
    METADATA_RECONCILE_INTERVAL: Duration = 30
    # Deadline of MigrateSchema calls (index builds on large tables take a while).
    METADATA_MIGRATE_TIMEOUT: float = Field(default=120.0, gt=0)

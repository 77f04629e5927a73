"""Settings of the metadata service, read once at start."""

from __future__ import annotations

from pydantic import Field

from crmkit.settings import DatabaseSettings, Duration, GrpcServiceSettings, NatsSettings


class MetadataSettings(GrpcServiceSettings, DatabaseSettings, NatsSettings):
    RECORDS_ADDR: str
    # How often the reconciler checks the workspaces records announced a schema for, plus the
    # next METADATA_RECONCILE_BATCH workspaces of its round-robin repair sweep.
    METADATA_RECONCILE_INTERVAL: Duration = 30
    METADATA_RECONCILE_BATCH: int = Field(default=20, ge=1, le=1000)
    # Deadline of MigrateSchema calls (index builds on large tables take a while).
    METADATA_MIGRATE_TIMEOUT: float = Field(default=120.0, gt=0)

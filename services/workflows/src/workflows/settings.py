"""Settings of the workflows service, read once at start."""

from __future__ import annotations

from crmkit.settings import DatabaseSettings, GrpcServiceSettings, NatsSettings


class WorkflowsSettings(GrpcServiceSettings, DatabaseSettings, NatsSettings):
    METADATA_ADDR: str
    RECORDS_ADDR: str

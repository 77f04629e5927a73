"""Settings of the webhooks service, read once at start."""

from __future__ import annotations

from pydantic import Field

from crmkit.retries import RetryDelays, parse_retry_delays
from crmkit.settings import DatabaseSettings, Duration, GrpcServiceSettings, NatsSettings

DEFAULT_RETRY_DELAYS = "60,300,900,3600,21600"


class WebhooksSettings(GrpcServiceSettings, DatabaseSettings, NatsSettings):
    METADATA_ADDR: str
    # Each delivery checks its webhook's author's current access with identity (docs/auth.md).
    IDENTITY_ADDR: str
    # Records left out of their event for size are read again from the records service.
    RECORDS_ADDR: str
    # Seconds an attempt may take: a 2xx status within it is a success, anything else a failure.
    WEBHOOK_TIMEOUT: float = Field(default=30.0, gt=0, le=300)
    # Seconds before each retry after a failed attempt (comma-separated); then the delivery fails.
    WEBHOOK_RETRY_DELAYS: RetryDelays = DEFAULT_RETRY_DELAYS
    # Allow targets on loopback, private, link-local... addresses (local runs and tests only).
    WEBHOOK_ALLOW_PRIVATE_TARGETS: bool = False
    # Run the deliverer (event intake and sending) in this process; false serves only the API.
    WEBHOOK_DELIVERER_ENABLED: bool = True
    # Attempts in flight at once in this process, and per target (scheme://host:port).
    WEBHOOK_MAX_CONCURRENCY: int = Field(default=64, ge=1, le=1000)
    WEBHOOK_MAX_CONCURRENCY_PER_TARGET: int = Field(default=8, ge=1, le=100)
    # How long JetStream waits for the deliverer to acknowledge an event before sending it again.
    WEBHOOK_CONSUMER_ACK_WAIT: Duration = 30
    # Finished deliveries (and events no delivery needs) older than this are deleted.
    WEBHOOK_DELIVERY_RETENTION: Duration = 30 * 24 * 3600

    @property
    def retry_delays(self) -> tuple[float, ...]:
        return parse_retry_delays(self.WEBHOOK_RETRY_DELAYS)

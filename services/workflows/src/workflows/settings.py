"""Settings of the workflows service, read once at start."""

from __future__ import annotations

from pydantic import Field

from crmkit.retries import RetryDelays, parse_retry_delays
from crmkit.settings import DatabaseSettings, Duration, GrpcServiceSettings, NatsSettings


class WorkflowsSettings(GrpcServiceSettings, DatabaseSettings, NatsSettings):
    METADATA_ADDR: str
    RECORDS_ADDR: str
    # Each run checks its workflow's author's current access with identity (docs/auth.md).
    IDENTITY_ADDR: str
    # Seconds an HTTP action may take: a 2xx status within it is a success.
    WORKFLOW_TIMEOUT: float = Field(default=30.0, gt=0, le=300)
    # Seconds before each retry after a failed attempt (comma-separated); then the run fails.
    WORKFLOW_RETRY_DELAYS: RetryDelays = "10,60,300"
    # One switch for every outbound request (webhooks and workflow actions): allow loopback,
    # private, link-local... targets (local runs and tests only).
    WEBHOOK_ALLOW_PRIVATE_TARGETS: bool = False
    # Run the runner (event intake, scheduler, sending) in this process; false: only the API.
    WORKFLOW_RUNNER_ENABLED: bool = True
    # Actions in flight at once in this process.
    WORKFLOW_MAX_CONCURRENCY: int = Field(default=32, ge=1, le=1000)
    # Smallest time between two ticks of a SCHEDULED workflow (seconds crons need it below 60).
    WORKFLOW_MIN_SCHEDULE_INTERVAL: Duration = Field(default=60, ge=1)
    # How long JetStream waits for the runner to acknowledge an event before sending it again.
    WORKFLOW_CONSUMER_ACK_WAIT: Duration = 30
    # Finished runs older than this are deleted.
    WORKFLOW_RUN_RETENTION: Duration = 30 * 24 * 3600

    @property
    def retry_delays(self) -> tuple[float, ...]:
        return parse_retry_delays(self.WORKFLOW_RETRY_DELAYS)

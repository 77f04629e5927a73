"""Settings of the records service, read once at start."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from crmkit.messaging import RECORD_STREAM_DUPLICATE_WINDOW
from crmkit.settings import DatabaseSettings, Duration, GrpcServiceSettings, NatsSettings


class RecordsSettings(GrpcServiceSettings, DatabaseSettings, NatsSettings):
    # Seconds a statement may run (PostgreSQL's statement_timeout; 0: no limit). Below the callers'
    # deadline (GRPC_CALL_TIMEOUT, 10 s) so a stalled write is cancelled and rolled back, a
    # definite 503, before the caller gives up with a 504 that may still commit. Schema migrations
    # are exempt (their caller sets their deadline).
    DB_STATEMENT_TIMEOUT: float = Field(default=8.0, ge=0)
    # Prepared statements kept per connection (one per table, version and query shape).
    DB_STATEMENT_CACHE_SIZE: int = Field(default=1024, ge=0)
    # Workspaces whose compiled data model is kept in memory.
    SCHEMA_CACHE_SIZE: int = Field(default=2000, ge=1)
    # totalCount (and a count asked alone) is exact up to this many matches, a marked estimate
    # beyond; 0: always exact.
    RECORDS_COUNT_CAP: int = Field(default=10_000, ge=0)
    # Outbox rows the relay reads and publishes per round.
    OUTBOX_RELAY_BATCH_SIZE: int = Field(default=500, ge=1, le=4000)
    # Seconds the relay lets rows gather after a read that found less than a batch, before the
    # next: one statement then reads and marks the rows of many commits (at ~1,200 creates/s,
    # 5 ms cut a create's CPU by ~0.1 ms). It adds up to this much to an event's latency.
    OUTBOX_RELAY_GATHER: float = Field(default=0.005, ge=0, le=1)
    # Seconds the relay waits for JetStream to acknowledge a round before retrying it.
    OUTBOX_PUBLISH_TIMEOUT: float = Field(default=5.0, gt=0)
    # How long published outbox rows are kept (for inspection) before the relay deletes them;
    # replay is the stream's job (RECORD_STREAM_MAX_AGE).
    OUTBOX_RETENTION: Duration = Field(default=3600, ge=0)
    # Limits of the JetStream stream of record events, applied by the relay: events older than
    # this, or beyond this many bytes (oldest first), are discarded. 0 bytes: no byte limit.
    RECORD_STREAM_MAX_AGE: Duration = Field(default=7 * 24 * 3600, gt=0)
    RECORD_STREAM_MAX_BYTES: int = Field(default=0, ge=0)
    # How long the stream remembers an event id to drop a copy the relay publishes again after a
    # takeover (consumers dedupe on the event id beyond it); NATS holds ~100 bytes per event
    # published within it. At most RECORD_STREAM_MAX_AGE.
    RECORD_STREAM_DUPLICATE_WINDOW: Duration = Field(default=RECORD_STREAM_DUPLICATE_WINDOW, gt=0)
    # Which record events the relay publishes (docs/events.md, "Who listens"): `interested`, only
    # those of workspaces somebody listens to (a webhook, a record-triggered workflow, an open
    # subscription; the others are marked published unpublished); `all`, every event, for
    # operators who consume the stream themselves.
    RECORD_EVENTS_PUBLISH: Literal["interested", "all"] = "interested"
    # Whether an import's events are published several to a message (docs/events.md, "Bulk
    # writes"); off, every event travels alone, for stream readers that do not read batches.
    RECORD_EVENTS_BULK_BATCHES: bool = True
    # Statements of single-record creates one caller may have in flight in one object; creates
    # that arrive while that many run wait and go together in the next statement, up to 100 (one
    # commit for all: docs/decisions.md, "Creates that arrive together"). 0: every create alone.
    CREATE_GROUP_IN_FLIGHT: int = Field(default=2, ge=0, le=64)
    # How long a write's Idempotency-Key is remembered (docs/api.md): a retry with the key within
    # it replays the first answer. Expired keys are pruned every minute.
    IDEMPOTENCY_KEY_TTL: Duration = Field(default=24 * 3600, ge=1)
    # Record history (docs/data-model.md): entries older than this many days are pruned; 0 keeps
    # every entry. The pruner deletes at most RECORD_HISTORY_PRUNE_BATCH rows per statement and
    # RECORD_HISTORY_PRUNE_MAX_BATCHES statements per run, one run every
    # RECORD_HISTORY_PRUNE_INTERVAL.
    RECORD_HISTORY_RETENTION_DAYS: int = Field(default=365, ge=0)
    RECORD_HISTORY_PRUNE_INTERVAL: Duration = Field(default=600, ge=1)
    RECORD_HISTORY_PRUNE_BATCH: int = Field(default=1000, ge=1, le=10_000)
    RECORD_HISTORY_PRUNE_MAX_BATCHES: int = Field(default=20, ge=1)
    # Import jobs (docs/api.md, "Import"): queued or running jobs a workspace may have at once
    # (another upload is a 429), rows written per batch (one transaction each), and how often an
    # idle worker looks for queued jobs.
    IMPORT_MAX_CONCURRENT_PER_WORKSPACE: int = Field(default=2, ge=1)
    IMPORT_BATCH_SIZE: int = Field(default=1000, ge=1, le=1000)
    IMPORT_POLL_INTERVAL: float = Field(default=1.0, gt=0)

    @model_validator(mode="after")
    def _window_within_age(self) -> RecordsSettings:
        # JetStream refuses a stream whose duplicate window exceeds its maximum age.
        if self.RECORD_STREAM_DUPLICATE_WINDOW > self.RECORD_STREAM_MAX_AGE:
            raise ValueError("RECORD_STREAM_DUPLICATE_WINDOW must not exceed RECORD_STREAM_MAX_AGE")
        return self

"""The records service's settings refuse a stream duplicate window longer than the stream keeps
its events (JetStream would refuse the stream, and the relay would retry it forever)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from records.settings import RecordsSettings

REQUIRED = {
    "APP_SECRET": "s" * 32,
    "DATABASE_URL": "postgresql://127.0.0.1/crm",
    "NATS_URL": "nats://127.0.0.1:4222",
}


def settings(**values: str) -> RecordsSettings:
    return RecordsSettings(**{**REQUIRED, **values})  # type: ignore[arg-type]


def test_the_duplicate_window_defaults_to_30_seconds() -> None:
    assert settings().RECORD_STREAM_DUPLICATE_WINDOW == 30


def test_the_duplicate_window_takes_a_duration() -> None:
    assert settings(RECORD_STREAM_DUPLICATE_WINDOW="2m").RECORD_STREAM_DUPLICATE_WINDOW == 120


def test_a_duplicate_window_longer_than_the_streams_age_is_refused() -> None:
    with pytest.raises(ValidationError, match="RECORD_STREAM_DUPLICATE_WINDOW"):
        settings(RECORD_STREAM_MAX_AGE="1m", RECORD_STREAM_DUPLICATE_WINDOW="2m")

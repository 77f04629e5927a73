from __future__ import annotations

import json
import logging

import pytest
from opentelemetry.sdk.trace import TracerProvider

from crmkit.logs import JsonFormatter
from crmkit.settings import Duration, GrpcServiceSettings, load_settings


class WithDuration(GrpcServiceSettings):
    ACCESS_TOKEN_EXPIRES_IN: Duration = 1800


def test_settings_read_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("APP_SECRET", "x" * 32)
    monkeypatch.setenv("GRPC_PORT", "50099")
    monkeypatch.setenv("ACCESS_TOKEN_EXPIRES_IN", "45m")
    settings = load_settings(WithDuration)
    assert settings.GRPC_PORT == 50099
    assert settings.ACCESS_TOKEN_EXPIRES_IN == 2700


def test_bad_setting_exits_with_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("APP_SECRET", "short")
    monkeypatch.setenv("ACCESS_TOKEN_EXPIRES_IN", "forever")
    with pytest.raises(SystemExit) as exited:
        load_settings(WithDuration)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "APP_SECRET" in err
    assert "ACCESS_TOKEN_EXPIRES_IN" in err


def test_json_logs_carry_trace_ids() -> None:
    tracer = TracerProvider().get_tracer("test")
    formatter = JsonFormatter("records")
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "hello %s", ("world",), None)
    record.workspace = "ws-1"
    with tracer.start_as_current_span("span") as span:
        entry = json.loads(formatter.format(record))
    assert entry["message"] == "hello world"
    assert entry["service"] == "records"
    assert entry["workspace"] == "ws-1"
    assert entry["trace_id"] == format(span.get_span_context().trace_id, "032x")

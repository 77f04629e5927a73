from __future__ import annotations

import pytest

from crmstack.processes import render_line
from crmstack.stack import StackConfig, StackError


def test_json_log_lines_become_readable() -> None:
    line = (
        '{"time":"2026-01-01T10:00:00.123+00:00","level":"info","service":"records",'
        '"logger":"x","message":"serving","grpc_address":"127.0.0.1:1"}'
    )
    assert render_line(line) == "10:00:00.123 INFO    serving  grpc_address=127.0.0.1:1"


def test_other_lines_are_unchanged() -> None:
    assert render_line("plain text") == "plain text"
    assert render_line("{not json") == "{not json"


def test_replicas_from_environment() -> None:
    assert StackConfig.replicas_from_env({"REPLICAS_gateway": "2", "REPLICAS_webhooks": "3"}) == {
        "gateway": 2,
        "webhooks": 3,
    }


@pytest.mark.parametrize("value", ["0", "x", "17", "-1"])
def test_bad_replica_counts_are_refused(value: str) -> None:
    with pytest.raises(StackError, match="REPLICAS_records"):
        StackConfig.replicas_from_env({"REPLICAS_records": value})

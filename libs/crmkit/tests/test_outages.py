"""Connection-level failures are told apart from bugs, and an outage is logged once."""

from __future__ import annotations

import logging

import asyncpg
import nats.errors
import pytest

from crmkit.errors import unavailable_dependency
from crmkit.outages import OutageLog


@pytest.mark.parametrize(
    ("error", "dependency"),
    [
        (ConnectionRefusedError(111, "Connection refused"), "database"),
        (ConnectionResetError(), "database"),
        (TimeoutError(), "database"),
        (
            asyncpg.exceptions.CannotConnectNowError("the database system is starting up"),
            "database",
        ),
        (asyncpg.exceptions.ConnectionDoesNotExistError("closed mid-query"), "database"),
        (asyncpg.exceptions.AdminShutdownError("terminating connection"), "database"),
        (asyncpg.exceptions.QueryCanceledError("statement timeout"), "database"),
        (asyncpg.exceptions.TooManyConnectionsError("too many clients"), "database"),
        (asyncpg.InterfaceError("cannot perform operation: connection is closed"), "database"),
        (
            asyncpg.exceptions.InternalClientError(
                "cannot switch to state 15; another operation (2) is in progress"
            ),
            "database",
        ),
        (nats.errors.NoServersError(), "nats"),
        (nats.errors.TimeoutError(), "nats"),
        (asyncpg.exceptions.UniqueViolationError("duplicate key"), None),
        (asyncpg.InterfaceError("another operation is in progress"), None),
        (RuntimeError("a bug"), None),
    ],
)
def test_connection_level_failures_are_unavailable(
    error: BaseException, dependency: str | None
) -> None:
    assert unavailable_dependency(error) == dependency


def test_an_outage_is_logged_once_then_its_recovery(caplog: pytest.LogCaptureFixture) -> None:
    outage = OutageLog("database", logging.getLogger("test.outages"))
    with caplog.at_level(logging.WARNING, logger="test.outages"):
        outage.recovered()  # nothing to say while it was up
        for _ in range(100):
            outage.failed(ConnectionRefusedError(111, "Connection refused"))
        assert outage.down
        outage.recovered()
        outage.recovered()
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 2, messages
    assert messages[0].startswith("database unavailable (logged once per outage)")
    assert "100 calls failed" in messages[1]
    assert not outage.down

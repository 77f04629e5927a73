"""Connection-level failures are told apart from bugs, and an outage is logged once."""

from __future__ import annotations

import logging

import asyncpg
import nats.errors
import pytest

from crmkit.db import PoolFloorRetries
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
        # Rolled back by the server; the same request again may pass.
        (asyncpg.exceptions.DeadlockDetectedError("deadlock detected"), "database"),
        (asyncpg.exceptions.SerializationError("could not serialize access"), "database"),
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


def test_pool_floor_retries_log_one_line_a_minute_without_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    logger = logging.getLogger("test.asyncpg.pool")
    retries = PoolFloorRetries(every_seconds=60)
    logger.addFilter(retries)
    try:
        with caplog.at_level(logging.WARNING, logger="test.asyncpg.pool"):
            for _ in range(3):
                try:
                    raise ConnectionRefusedError(111, "Connection refused")
                except ConnectionRefusedError:
                    logger.warning(
                        "Failed to restore the pool connection floor; retrying", exc_info=True
                    )
            logger.warning("another warning")
    finally:
        logger.removeFilter(retries)
    messages = [record.getMessage() for record in caplog.records]
    assert messages == [
        "Failed to restore the pool connection floor; retrying (at most once a minute):"
        " [Errno 111] Connection refused",
        "another warning",
    ]
    assert caplog.records[0].exc_info is None

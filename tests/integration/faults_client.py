"""Helpers for the fault tests (test_faults.py, test_fault_campaign.py): a stack of the module's
own (they stop, kill and restart its infrastructure and services), the documented 503, and
signals to PostgreSQL's whole process tree."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from crmstack.stack import Stack
from tests.integration.conftest import TEST_ENV, _running_stack

SIGNUP_PER_IP = 3
SIGNUP_TOTAL = 12
FAULTS_ENV = {
    **TEST_ENV,
    "SIGNUP_MAX_PER_IP": str(SIGNUP_PER_IP),
    "SIGNUP_MAX_TOTAL": str(SIGNUP_TOTAL),
    # Records' statement timeout, below the callers' deadline (GRPC_CALL_TIMEOUT, 10 s).
    "DB_STATEMENT_TIMEOUT": "3",
}


# A test module takes it with `faults_stack = faults_client.faults_stack` (its own stack).
@pytest.fixture(scope="module")
def faults_stack() -> Iterator[Stack]:
    if os.environ.get("CRM_BASE_URL"):
        pytest.skip("needs the local launcher: the tests stop and restart PostgreSQL, Valkey, NATS")
    with _running_stack("crm-it-faults-", {}, FAULTS_ENV) as running:
        if running.infra is None:
            pytest.skip("external infrastructure (DATABASE_URL etc.): the tests cannot stop it")
        yield running


def wait_until(what: str, check: Any, timeout: float = 90) -> Any:
    """`check()`'s first truthy result, polled every 0.5 s; fails after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s"
        time.sleep(0.5)


def assert_unavailable(response: httpx.Response) -> None:
    """The documented 503 (docs/api.md, "Outages and safe retries")."""
    assert response.status_code == 503, response.text
    assert int(response.headers["retry-after"]) >= 1
    body = response.json()
    assert body["statusCode"] == 503
    assert body["error"] == "Service Unavailable"
    assert set(body["details"]) == {"field", "message"}


def signal_all(postmaster: int, sig: int) -> None:
    """`sig` to PostgreSQL's postmaster and every backend it started (a stall or a crash of the
    server, not only of new connections)."""
    pids = [postmaster]
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        if int(fields[1]) == postmaster:
            pids.append(int(stat.parent.name))
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)

"""The whole stack for the integration suite.

By default a session fixture starts it with the same launcher as `make run` (embedded servers
unless DATABASE_URL / REDIS_URL / NATS_URL are set). With CRM_BASE_URL set, the suite runs
against that deployment instead (e.g. a kind cluster); tests that must kill or restart local
processes skip there, saying so.
"""

from __future__ import annotations

import os
import secrets
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from crmstack.ports import free_port
from crmstack.processes import ManagedProcess
from crmstack.stack import Stack, StackConfig

# Where identity sends email during the suite: the password-reset tests listen there (aiosmtpd).
SMTP_TEST_PORT = free_port()

# Settings the tests rely on: short timers so retries and schedules happen within a test.
TEST_ENV: dict[str, str] = {
    "WEBHOOK_ALLOW_PRIVATE_TARGETS": "true",
    # Webhook retries after 1, 2 and 3 seconds (4 attempts), attempts time out after 5 s, and
    # JetStream resends an unacknowledged event after 10 s (a killed deliverer's batch).
    "WEBHOOK_RETRY_DELAYS": "1,2,3",
    "WEBHOOK_TIMEOUT": "5",
    "WEBHOOK_CONSUMER_ACK_WAIT": "10",
    # Workflow runs retry after 1, 2 and 3 seconds, actions time out after 5 s (a lease then
    # lasts 15 s), and schedules may fire every second (seconds-level cron in the tests).
    "WORKFLOW_RETRY_DELAYS": "1,2,3",
    "WORKFLOW_TIMEOUT": "5",
    "WORKFLOW_CONSUMER_ACK_WAIT": "10",
    "WORKFLOW_MIN_SCHEDULE_INTERVAL": "1",
    "LOG_LEVEL": "INFO",
    # The metadata reconciler's full pass; short so drift repair is seen within a test.
    "METADATA_RECONCILE_INTERVAL": "2",
    # Requests from the suite may name a client IP in X-Forwarded-For (brute-force limits per IP).
    "TRUSTED_PROXIES": "127.0.0.1/32",
    "SMTP_URL": f"smtp://127.0.0.1:{SMTP_TEST_PORT}",
}


@pytest.fixture(scope="session")
def stack() -> Iterator[Stack | None]:
    if os.environ.get("CRM_BASE_URL"):
        yield None
        return
    keep = os.environ.get("CRM_KEEP_TEST_DATA") == "1"
    data_dir = Path(tempfile.mkdtemp(prefix="crm-it-"))
    config = StackConfig(
        data_dir=data_dir,
        replicas=StackConfig.replicas_from_env(os.environ),
        app_secret=secrets.token_urlsafe(48),
        extra_env=TEST_ENV,
        fast_postgres=True,
    )
    running = Stack(config)
    running.start()
    try:
        yield running
    finally:
        running.stop()
        if not keep:
            import shutil

            shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def base_url(stack: Stack | None) -> str:
    if stack is None:
        return os.environ["CRM_BASE_URL"].rstrip("/")
    return stack.base_url


@pytest.fixture
def local_stack(stack: Stack | None) -> Stack:
    """The locally launched stack, for tests that kill or restart processes."""
    if stack is None:
        pytest.skip("needs the local launcher: CRM_BASE_URL points at a remote deployment")
    return stack


@pytest.fixture(scope="session")
def client(base_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base_url, timeout=30) as http:
        yield http


@pytest.fixture(scope="session")
def smtp_port(stack: Stack | None) -> int:
    """The port identity sends email to during the suite (nothing listens until a test does)."""
    if stack is None:
        pytest.skip("needs the local launcher: the test's SMTP server must receive the email")
    return SMTP_TEST_PORT


@pytest.fixture
def extra_gateway(local_stack: Stack) -> Iterator[Callable[[dict[str, str]], str]]:
    """Starts more gateway processes on the running stack (optionally with other settings)."""
    started: list[ManagedProcess] = []

    def start(env: dict[str, str]) -> str:
        port = free_port()
        process = ManagedProcess(
            name=f"gateway-extra-{port}",
            command=[sys.executable, "-m", "gateway"],
            env={**local_stack.env, "PORT": str(port), "HOST": "127.0.0.1", **env},
            log_path=local_stack.logs / f"gateway-extra-{port}.log",
        )
        process.start()
        started.append(process)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/healthz", timeout=5).status_code == 200:
                    return url
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or not process.is_running():
                raise AssertionError(f"extra gateway did not start:\n{process.tail()}")
            time.sleep(0.2)

    yield start
    for process in started:
        process.stop()

"""The whole stack for the integration suite.

By default a session fixture starts it with the same launcher as `make run` (embedded servers
unless DATABASE_URL / REDIS_URL / NATS_URL are set). With CRM_BASE_URL set, the suite runs
against that deployment instead (e.g. a kind cluster); tests that must kill or restart local
processes skip there, saying so.
"""

from __future__ import annotations

import os
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from crmstack.ports import free_port
from crmstack.processes import ManagedProcess
from crmstack.stack import GATEWAY, Stack, StackConfig
from tests.integration.subscriptions_client import GATEWAY_METRICS

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
    # The metadata reconciler's tick; short so drift repair is seen within a test.
    "METADATA_RECONCILE_INTERVAL": "2",
    # Workspaces the reconciler's repair sweep checks per tick (fewer than the suite creates).
    "METADATA_RECONCILE_BATCH": "3",
    # Requests from the suite may name a client IP in X-Forwarded-For (brute-force limits per IP).
    "TRUSTED_PROXIES": "127.0.0.1/32",
    "SMTP_URL": f"smtp://127.0.0.1:{SMTP_TEST_PORT}",
    # The API rate limit, far above what any test sends with one credential (1,000 subscriptions
    # on one token, thousands of records paged through). The limit itself is tested on
    # `scaled_stack`, which keeps the default 100 calls per 60 s.
    "API_RATE_LIMITING_LIMIT": "1000000",
    # Every test signs up from 127.0.0.1, hundreds per run; the sign-up limits are tested on the
    # stack of test_faults.py.
    "SIGNUP_MAX_PER_IP": "100000",
    "SIGNUP_MAX_TOTAL": "100000",
}

# The stack of test_rate_limits.py and test_scaling.py: two gateways and two webhook deliverers,
# the rate limit at its defaults (set explicitly so a change of default cannot go unnoticed).
SCALED_REPLICAS = {"gateway": 2, "webhooks": 2}
SCALED_ENV: dict[str, str] = {
    **TEST_ENV,
    "API_RATE_LIMITING_LIMIT": "100",
    "API_RATE_LIMITING_TTL": "60000",
}


@contextmanager
def _running_stack(
    prefix: str, replicas: Mapping[str, int], env: Mapping[str, str]
) -> Iterator[Stack]:
    keep = os.environ.get("CRM_KEEP_TEST_DATA") == "1"
    data_dir = Path(tempfile.mkdtemp(prefix=prefix))
    config = StackConfig(
        data_dir=data_dir,
        replicas=replicas,
        app_secret=secrets.token_urlsafe(48),
        extra_env=env,
        fast_postgres=True,
    )
    running = Stack(config)
    running.start()
    for gateway in running.instances.get(GATEWAY, []):
        GATEWAY_METRICS[f"http://127.0.0.1:{gateway.port}"] = (
            f"http://127.0.0.1:{gateway.metrics_port}"
        )
    try:
        yield running
    finally:
        running.stop()
        if not keep:
            shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def stack() -> Iterator[Stack | None]:
    if os.environ.get("CRM_BASE_URL"):
        yield None
        return
    with _running_stack("crm-it-", StackConfig.replicas_from_env(os.environ), TEST_ENV) as running:
        yield running


@pytest.fixture(scope="session")
def scaled_stack() -> Iterator[Stack]:
    """A second local stack, started once for the session by the first test that asks: two
    gateways and two webhook deliverers, the default rate limit (SCALED_ENV)."""
    if os.environ.get("CRM_BASE_URL"):
        pytest.skip("needs the local launcher: it starts its own stack with two gateways")
    with _running_stack("crm-it-scaled-", SCALED_REPLICAS, SCALED_ENV) as running:
        yield running


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
    with gateway_starter(local_stack) as start:
        yield start


@contextmanager
def gateway_starter(on: Stack) -> Iterator[Callable[[dict[str, str]], str]]:
    """start(env) runs one more gateway process on `on` and returns its URL once healthy; all
    are stopped (by PID) on exit."""
    started: list[ManagedProcess] = []

    def start(env: dict[str, str]) -> str:
        port, metrics_port = free_port(), free_port()
        process = ManagedProcess(
            name=f"gateway-extra-{port}",
            command=[sys.executable, "-m", "gateway"],
            env={
                **on.env,
                "PORT": str(port),
                "HOST": "127.0.0.1",
                "METRICS_PORT": str(metrics_port),
                "METRICS_HOST": "127.0.0.1",
                **env,
            },
            log_path=on.logs / f"gateway-extra-{port}.log",
        )
        process.start()
        started.append(process)
        url = f"http://127.0.0.1:{port}"
        GATEWAY_METRICS[url] = f"http://127.0.0.1:{metrics_port}"
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

    try:
        yield start
    finally:
        for process in started:
            process.stop()

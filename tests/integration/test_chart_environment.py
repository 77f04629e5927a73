"""Every service runs on exactly the environment the Helm chart gives its pods (default values).

The chart's Deployment env is rendered offline; secrets, peer addresses and ports are pointed at
the local stack, and each service is started as a second process beside it. A service that needs
a variable the chart does not set, or that stops without one it treats as optional, fails here
instead of crash-looping in a cluster.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from crmstack.ports import free_port, wait_for_port
from crmstack.stack import GRPC_SERVICES, Stack
from tests.chart.rendering import container, env_of, render

# Variables the process needs to run at all, outside what the chart controls (the image's ENV).
PROCESS_ENV = ("PATH", "HOME", "LANG", "PYTHONPATH", "VIRTUAL_ENV")


@pytest.fixture(scope="module")
def chart_deployments() -> dict[str, dict[str, Any]]:
    rendered = render({})
    return {
        deployment["metadata"]["name"].removeprefix("crm-"): container(
            deployment["spec"]["template"]["spec"]
        )
        for deployment in rendered.of_kind("Deployment")
    }


def local_environment(spec: dict[str, Any], stack: Stack) -> dict[str, str]:
    """The container's env with Secret references, peers and ports resolved to the local stack."""
    env = {key: value for key, value in stack.env.items() if key in PROCESS_ENV}
    for name, variable in env_of(spec).items():
        if "value" in variable:
            env[name] = variable["value"]
        else:
            # APP_SECRET and the connection URLs come from the chart's Secret, keyed by name.
            assert variable["valueFrom"]["secretKeyRef"]["key"] == name
            env[name] = stack.env[name]
        if name.endswith("_ADDR"):
            env[name] = stack.env[name]
    env.update(METRICS_HOST="127.0.0.1", GRPC_HOST="127.0.0.1", HOST="127.0.0.1")
    return env


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    processes: list[subprocess.Popen[bytes]] = []
    yield processes
    for process in processes:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _start(
    service: str, env: dict[str, str], started: list[subprocess.Popen[bytes]]
) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(
        [sys.executable, "-m", service], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    started.append(process)
    return process


def _listening(process: subprocess.Popen[bytes], port: int, timeout: float = 60) -> bool:
    """Whether `process` listens on `port` before it exits or the timeout passes."""
    deadline = time.monotonic() + timeout
    while process.poll() is None and time.monotonic() < deadline:
        if wait_for_port(port, 0.5):
            return True
    return False


def _output(process: subprocess.Popen[bytes]) -> str:
    process.kill()
    out, _ = process.communicate(timeout=10)
    return out.decode(errors="replace")[-2000:]


@pytest.mark.parametrize("service", GRPC_SERVICES)
def test_grpc_service_serves_on_the_chart_environment(
    service: str,
    local_stack: Stack,
    chart_deployments: dict[str, dict[str, Any]],
    started: list[subprocess.Popen[bytes]],
) -> None:
    env = local_environment(chart_deployments[service], local_stack)
    port = free_port()
    env.update(GRPC_PORT=str(port), METRICS_PORT=str(free_port()))
    process = _start(service, env, started)
    if not _listening(process, port):
        raise AssertionError(f"{service} never listened:\n{_output(process)}")
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=10
        )
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    time.sleep(1)  # a background job that returns at once stops the service within this second
    if process.poll() is not None:
        raise AssertionError(f"{service} stopped by itself:\n{_output(process)}")


def test_gateway_serves_on_the_chart_environment(
    local_stack: Stack,
    chart_deployments: dict[str, dict[str, Any]],
    started: list[subprocess.Popen[bytes]],
) -> None:
    env = local_environment(chart_deployments["gateway"], local_stack)
    port = free_port()
    env["PORT"] = str(port)
    process = _start("gateway", env, started)
    if not _listening(process, port):
        raise AssertionError(f"the gateway never listened:\n{_output(process)}")
    base = f"http://127.0.0.1:{port}"
    assert httpx.get(f"{base}/livez", timeout=10).status_code == 200
    deadline = time.monotonic() + 30
    while (health := httpx.get(f"{base}/healthz", timeout=10)).status_code != 200:
        assert time.monotonic() < deadline, health.text
        time.sleep(0.2)
    assert set(health.json()["checks"]) == {*GRPC_SERVICES, "database", "redis", "nats"}

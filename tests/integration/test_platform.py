"""Platform foundation: health, reflection, error shapes, metrics, graceful shutdown."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from crmstack.stack import GRPC_SERVICES, Stack
from tests.integration.subscriptions_client import gateway_metrics

EXPECTED_SERVICES = {
    "identity": {
        "crm.identity.v1.AuthService",
        "crm.identity.v1.WorkspaceService",
        "crm.identity.v1.RoleService",
        "crm.identity.v1.CredentialService",
        "crm.identity.v1.OAuthService",
    },
    "metadata": {"crm.metadata.v1.MetadataService"},
    "records": {"crm.records.v1.RecordsService"},
    "webhooks": {"crm.webhooks.v1.WebhookService"},
    "workflows": {"crm.workflows.v1.WorkflowService"},
}


def _wait_for_status(client: httpx.Client, status: int, timeout: float = 30) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while True:
        response = client.get("/healthz")
        if response.status_code == status:
            body: dict[str, object] = response.json()
            return body
        if time.monotonic() > deadline:
            raise AssertionError(f"/healthz stayed {response.status_code}: {response.text}")
        time.sleep(0.2)


def test_healthz_lists_every_part(client: httpx.Client) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "ok"
    assert body["failing"] == []
    expected = {*GRPC_SERVICES, "database", "redis", "nats"}
    assert set(body["checks"]) == expected
    assert all(check["status"] == "up" for check in body["checks"].values())


def test_killed_service_makes_healthz_503_naming_it(
    local_stack: Stack, client: httpx.Client
) -> None:
    local_stack.kill("webhooks")
    try:
        body = _wait_for_status(client, 503)
        assert body["failing"] == ["webhooks"]
        assert body["status"] == "unavailable"
        assert body["checks"]["webhooks"]["status"] == "down"  # type: ignore[index]
        ready = client.get("/readyz")  # the readiness probe: an upstream is needed to serve
        assert ready.status_code == 503
        assert ready.json()["failing"] == ["webhooks"]
    finally:
        local_stack.restart("webhooks")
    body = _wait_for_status(client, 200)
    assert body["failing"] == []


def test_every_service_lists_its_services_through_reflection(local_stack: Stack) -> None:
    grpcurl = shutil.which("grpcurl") or str(Path(sys.executable).parent / "grpcurl")
    for service, expected in EXPECTED_SERVICES.items():
        result = subprocess.run(
            [grpcurl, "-plaintext", local_stack.grpc_address(service), "list"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        listed = set(result.stdout.split())
        assert expected <= listed, (service, listed)
        assert "grpc.health.v1.Health" in listed


def test_unknown_route_gets_the_rest_error_body(client: httpx.Client) -> None:
    response = client.get("/no/such/route")
    assert response.status_code == 404
    body = response.json()
    assert body["statusCode"] == 404
    assert body["error"] == "Not Found"
    assert set(body) == {"statusCode", "message", "error", "details"}
    assert set(body["details"]) == {"field", "message"}


@pytest.mark.parametrize("path", ["/graphql", "/metadata"])
def test_graphql_without_credential_is_unauthenticated(client: httpx.Client, path: str) -> None:
    response = client.post(path, json={"query": "{ apiVersion }"})
    assert response.status_code == 401
    body = response.json()
    assert body["data"] is None
    assert body["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED"


def test_metrics_use_route_templates(client: httpx.Client) -> None:
    client.get("/healthz")
    client.get("/no/such/route/123")
    text = gateway_metrics(str(client.base_url))
    assert 'http_requests_total{method="GET",route="/healthz",status="200"}' in text
    assert 'route="unmatched"' in text
    assert "/no/such/route/123" not in text


def test_service_metrics_are_served_on_their_own_port(local_stack: Stack) -> None:
    instance = local_stack.instances["records"][0]
    text = httpx.get(f"http://127.0.0.1:{instance.metrics_port}/metrics", timeout=10).text
    assert "grpc_server_handled_total" in text


def test_sigterm_drains_and_exits_cleanly(local_stack: Stack, client: httpx.Client) -> None:
    instance = local_stack.instances["workflows"][0]
    try:
        code = instance.process.stop(grace=15)
        assert code == 0
        log = instance.process.log_path.read_text()
        assert '"message":"shutting down"' in log
        assert '"message":"stopped"' in log
    finally:
        local_stack.restart("workflows")
    _wait_for_status(client, 200)


@pytest.mark.parametrize(
    ("missing", "service"), [("APP_SECRET", "records"), ("DATABASE_URL", "metadata")]
)
def test_missing_setting_fails_fast_naming_it(
    local_stack: Stack, missing: str, service: str
) -> None:
    env = {key: value for key, value in local_stack.env.items() if key != missing}
    env["GRPC_PORT"] = "1"
    result = subprocess.run(
        [sys.executable, "-m", service],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("configuration error:")
    assert missing in lines[0]


def test_invalid_setting_fails_fast_naming_it(local_stack: Stack) -> None:
    env = dict(local_stack.env, GRPC_PORT="not-a-port")
    result = subprocess.run(
        [sys.executable, "-m", "records"], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "GRPC_PORT" in result.stderr
    assert os.linesep not in result.stderr.strip()

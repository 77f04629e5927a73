"""Gateway probes: /livez (liveness) stays 200 while /readyz (readiness) and /healthz report an
outage of an upstream (docs/deploy.md, Probes; Redis and NATS: tests/integration/test_faults.py)."""

from __future__ import annotations

import time

import httpx

from crmstack.stack import Stack
from tests.integration.subscriptions_client import gateway_metrics


def _wait_for_healthz(client: httpx.Client, status: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while (response := client.get("/healthz")).status_code != status:
        if time.monotonic() > deadline:
            raise AssertionError(f"/healthz stayed {response.status_code}: {response.text}")
        time.sleep(0.2)


def test_livez_answers_without_credential(client: httpx.Client) -> None:
    response = client.get("/livez")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_livez_stays_ok_while_an_upstream_is_down(local_stack: Stack, client: httpx.Client) -> None:
    local_stack.kill("records")
    try:
        _wait_for_healthz(client, 503)
        assert client.get("/readyz").status_code == 503
        response = client.get("/livez")
        assert response.status_code == 200
        assert response.json() == {"status": "ok"}
    finally:
        local_stack.restart("records")
    _wait_for_healthz(client, 200)


def test_livez_is_counted_under_its_route(client: httpx.Client) -> None:
    client.get("/livez")
    metrics = gateway_metrics(str(client.base_url))
    assert 'http_requests_total{method="GET",route="/livez",status="200"}' in metrics

"""NetworkPolicies, evaluated as Kubernetes would: who may open which port of which pod."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from tests.chart.rendering import GRPC_SERVICES, NAMESPACE, SERVICES, Rendered, render


@dataclass(frozen=True)
class Pod:
    namespace: str
    labels: dict[str, str]


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions", []):
        key, operator = expression["key"], expression["operator"]
        values = expression.get("values", [])
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True


def _peer_admits(peer: dict[str, Any], source: Pod) -> bool:
    if "ipBlock" in peer:
        return False  # pods are not addressed by IP in these checks
    if "namespaceSelector" in peer:
        # Namespaces carry kubernetes.io/metadata.name; an empty selector matches every one.
        namespace_labels = {"kubernetes.io/metadata.name": source.namespace}
        if not _selects(peer["namespaceSelector"], namespace_labels):
            return False
    elif source.namespace != NAMESPACE:
        return False
    return _selects(peer.get("podSelector", {}), source.labels)


def allowed(rendered: Rendered, source: Pod, target: Pod, port: str) -> bool:
    """Whether `source` may connect to the named container `port` of `target` (ingress)."""
    policies = [
        policy
        for policy in rendered.of_kind("NetworkPolicy")
        if "Ingress" in policy["spec"]["policyTypes"]
        and target.namespace == NAMESPACE
        and _selects(policy["spec"]["podSelector"], target.labels)
    ]
    if not policies:
        return True
    for policy in policies:
        for rule in policy["spec"].get("ingress", []):
            ports = rule.get("ports")
            if ports and not any(p.get("port") == port for p in ports):
                continue
            peers = rule.get("from")
            if not peers or any(_peer_admits(peer, source) for peer in peers):
                return True
    return False


@pytest.fixture(scope="module")
def rendered() -> Rendered:
    return render({})


def pod_of(rendered: Rendered, owner: str) -> Pod:
    kind = "Job" if owner.endswith("-migrate") else "Deployment"
    labels = rendered.get(kind, f"crm-{owner}")["spec"]["template"]["metadata"]["labels"]
    return Pod(NAMESPACE, labels)


PROMETHEUS = Pod("monitoring", {"app.kubernetes.io/name": "prometheus"})
STRANGER = Pod(NAMESPACE, {"app": "something-else"})
STRANGER_ELSEWHERE = Pod("other", {"app": "something-else"})

# Who calls whom over gRPC (the gateway calls everyone; then each service's *_ADDR peers).
CALLERS = {
    "identity": {"gateway", "webhooks", "workflows"},
    "metadata": {"gateway", "identity", "webhooks", "workflows"},
    "records": {"gateway", "metadata", "webhooks", "workflows"},
    "webhooks": {"gateway"},
    "workflows": {"gateway"},
}


@pytest.mark.parametrize("target", GRPC_SERVICES)
def test_only_the_gateway_and_declared_peers_reach_a_grpc_port(
    rendered: Rendered, target: str
) -> None:
    destination = pod_of(rendered, target)
    for source in SERVICES:
        expected = source in CALLERS[target]
        assert allowed(rendered, pod_of(rendered, source), destination, "grpc") is expected, (
            f"{source} -> {target}"
        )
    assert not allowed(rendered, pod_of(rendered, f"{target}-migrate"), destination, "grpc")
    assert not allowed(rendered, STRANGER, destination, "grpc")
    assert not allowed(rendered, STRANGER_ELSEWHERE, destination, "grpc")


@pytest.mark.parametrize("target", SERVICES)
def test_only_prometheus_scrapes_metrics_ports(rendered: Rendered, target: str) -> None:
    destination = pod_of(rendered, target)
    assert allowed(rendered, PROMETHEUS, destination, "metrics")
    assert not allowed(rendered, STRANGER, destination, "metrics")
    assert not allowed(rendered, pod_of(rendered, "gateway"), destination, "metrics")


def test_the_gateway_is_open_on_http_only(rendered: Rendered) -> None:
    gateway = pod_of(rendered, "gateway")
    assert allowed(rendered, STRANGER_ELSEWHERE, gateway, "http")
    assert not allowed(rendered, STRANGER_ELSEWHERE, gateway, "grpc")


def test_migration_jobs_accept_no_connections(rendered: Rendered) -> None:
    for service in GRPC_SERVICES:
        job = pod_of(rendered, f"{service}-migrate")
        for port in ("grpc", "metrics", "http"):
            assert not allowed(rendered, pod_of(rendered, "gateway"), job, port)


def test_gateway_sources_can_be_restricted() -> None:
    restricted = render(
        {
            "networkPolicy": {
                "gatewayFrom": [
                    {
                        "namespaceSelector": {
                            "matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}
                        }
                    }
                ]
            }
        }
    )
    gateway = pod_of(restricted, "gateway")
    controller = Pod("ingress-nginx", {"app.kubernetes.io/name": "ingress-nginx"})
    assert allowed(restricted, controller, gateway, "http")
    assert not allowed(restricted, STRANGER_ELSEWHERE, gateway, "http")


def test_network_policies_can_be_turned_off() -> None:
    assert render({"networkPolicy": {"enabled": False}}).of_kind("NetworkPolicy") == []

"""ServiceMonitor and PrometheusRule: rendered only when enabled and the CRDs are served."""

from __future__ import annotations

import re

import promql_parser

from tests.chart.rendering import (
    GRPC_SERVICES,
    MONITORING_API_VERSIONS,
    NAMESPACE,
    SERVICES,
    render,
    render_with_api_versions,
    scenario_values,
)


def test_without_the_crds_nothing_is_rendered_and_the_notes_say_so() -> None:
    values = scenario_values("monitoring")
    for rendered in (render(values), render_with_api_versions(values, [])):
        assert rendered.of_kind("ServiceMonitor") == []
        assert rendered.of_kind("PrometheusRule") == []
        assert "no ServiceMonitor CRD" in rendered.notes
        assert "no PrometheusRule CRD" in rendered.notes


def test_with_the_crds_but_disabled_nothing_is_rendered() -> None:
    rendered = render_with_api_versions({}, MONITORING_API_VERSIONS)
    assert rendered.of_kind("ServiceMonitor") == []
    assert rendered.of_kind("PrometheusRule") == []
    assert "CRD" not in rendered.notes


def test_service_monitor_scrapes_every_service() -> None:
    rendered = render_with_api_versions(scenario_values("monitoring"), MONITORING_API_VERSIONS)
    assert "CRD" not in rendered.notes
    (monitor,) = rendered.of_kind("ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    spec = monitor["spec"]
    assert spec["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert spec["jobLabel"] == "app.kubernetes.io/component"
    endpoints = {endpoint["port"]: endpoint for endpoint in spec["endpoints"]}
    assert all(e["path"] == "/metrics" and e["interval"] == "15s" for e in endpoints.values())
    selector = spec["selector"]["matchLabels"]
    for service in SERVICES:
        target = rendered.get("Service", f"crm-{service}")
        labels = target["metadata"]["labels"]
        assert all(labels.get(key) == value for key, value in selector.items()), service
        assert labels["app.kubernetes.io/component"] == service  # becomes the job label
        scraped = {port["name"] for port in target["spec"]["ports"]} & set(endpoints)
        assert scraped == {"http" if service == "gateway" else "metrics"}, service


def test_prometheus_rule_alerts_on_errors_latency_and_down_services() -> None:
    rendered = render_with_api_versions(scenario_values("monitoring"), MONITORING_API_VERSIONS)
    (rule,) = rendered.of_kind("PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    (group,) = rule["spec"]["groups"]
    alerts = [r for r in group["rules"] if "alert" in r]
    names = {r["alert"] for r in alerts}
    assert {
        "CrmServiceDown",
        "CrmGatewayHighErrorRate",
        "CrmGatewayHighLatency",
        "CrmServiceHighErrorRate",
        "CrmServiceHighLatency",
    } <= names
    down = {r["labels"]["crm_service"]: r["expr"] for r in alerts if r["alert"] == "CrmServiceDown"}
    assert set(down) == set(SERVICES)
    assert 'service="crm-records"' in down["records"]
    by_name = {r["alert"]: r for r in alerts}
    assert "> 0.02" in by_name["CrmGatewayHighErrorRate"]["expr"]
    assert "> 0.5" in by_name["CrmServiceHighLatency"]["expr"]
    # Every Service a rule names exists in the release.
    services = {s["metadata"]["name"] for s in rendered.of_kind("Service")}
    for alert in alerts:
        for name in re.findall(r'service="([^"]+)"', alert["expr"]):
            assert name in services, (alert["alert"], name)
    grpc_selector = re.search(
        r'service=~"crm-\(([^)]*)\)"', by_name["CrmServiceHighErrorRate"]["expr"]
    )
    assert grpc_selector is not None
    assert set(grpc_selector.group(1).split("|")) == set(GRPC_SERVICES)
    records = [r for r in group["rules"] if "record" in r]
    assert records == [
        {
            "record": "crm:http_requests:rate5m",
            "expr": "sum by (namespace, route, status) (rate(http_requests_total[5m]))",
        }
    ]


def test_every_rule_is_valid_promql() -> None:
    rendered = render_with_api_versions(scenario_values("monitoring"), MONITORING_API_VERSIONS)
    (rule,) = rendered.of_kind("PrometheusRule")
    expressions = [r["expr"] for group in rule["spec"]["groups"] for r in group["rules"]]
    assert len(expressions) >= 10
    for expression in expressions:
        try:
            promql_parser.parse(expression)
        except ValueError as exc:
            raise AssertionError(f"{expression!r}: {exc}") from None

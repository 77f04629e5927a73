"""ServiceMonitor and PrometheusRule (rendered only when enabled and the CRDs are served), the
Grafana dashboard ConfigMap, and both held to the metrics documented in docs/observability.md."""

from __future__ import annotations

import json
import re
from typing import Any

import promql_parser

from tests.chart.rendering import (
    CHART,
    GRPC_SERVICES,
    MONITORING_API_VERSIONS,
    NAMESPACE,
    SERVICES,
    Rendered,
    render,
    render_with_api_versions,
    scenario_values,
)
from tests.metrics_reference import documented_series, metric_names

DASHBOARD = CHART / "dashboards" / "crm-overview.json"


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
    assert set(endpoints) == {"metrics"}
    for service in SERVICES:
        # The gateway's metrics port has a Service of its own; its public one carries HTTP only.
        name = "crm-gateway-metrics" if service == "gateway" else f"crm-{service}"
        target = rendered.get("Service", name)
        labels = target["metadata"]["labels"]
        assert all(labels.get(key) == value for key, value in selector.items()), service
        assert labels["app.kubernetes.io/component"] == service  # becomes the job label
        scraped = {port["name"] for port in target["spec"]["ports"]} & set(endpoints)
        assert scraped == {"metrics"}, service
    public = rendered.get("Service", "crm-gateway")
    assert [port["name"] for port in public["spec"]["ports"]] == ["http"]


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


def _rules(rendered: Rendered) -> list[dict[str, Any]]:
    (rule,) = rendered.of_kind("PrometheusRule")
    return [r for group in rule["spec"]["groups"] for r in group["rules"]]


# Series Prometheus makes itself (per scrape target), not the services.
_PROMETHEUS_SERIES = {"up"}


def test_every_rule_uses_only_documented_metrics() -> None:
    rendered = render_with_api_versions(scenario_values("monitoring"), MONITORING_API_VERSIONS)
    rules = _rules(rendered)
    recorded = {r["record"] for r in rules if "record" in r}
    known = documented_series() | recorded | _PROMETHEUS_SERIES
    for rule in rules:
        used = metric_names(rule["expr"])
        assert used, rule
        assert used <= known, (rule.get("alert") or rule.get("record"), used - known)


def test_alerts_on_outbox_lag_failing_deliveries_pools_and_rate_limit_fail_open() -> None:
    values = scenario_values("monitoring")
    rendered = render_with_api_versions(values, MONITORING_API_VERSIONS)
    by_name = {r["alert"]: r for r in _rules(rendered) if "alert" in r}
    lag = by_name["CrmOutboxLag"]["expr"]
    assert "records_outbox_relay_lag_seconds" in lag
    assert 'service="crm-records"' in lag
    assert "> 60" in lag
    failing = by_name["CrmWebhookDeliveriesFailing"]["expr"]
    assert 'outcome!="delivered"' in failing
    assert 'service="crm-webhooks"' in failing
    assert "> 0.25" in failing
    assert "gateway_rate_limit_failures_total" in by_name["CrmRateLimitFailOpen"]["expr"]
    pools = by_name["CrmDatabasePoolSaturated"]["expr"]
    assert "db_pool_connections_in_use" in pools
    assert "> 0.9" in pools
    for alert in by_name.values():
        assert alert["labels"]["severity"] in ("warning", "critical")
        assert alert["annotations"]["summary"]

    tuned = {
        **values,
        "metrics": {
            **values["metrics"],
            "prometheusRule": {
                **values["metrics"]["prometheusRule"],
                "outboxLagSeconds": 300,
                "webhookFailureRatio": 0.5,
            },
        },
    }
    by_name = {
        r["alert"]: r
        for r in _rules(render_with_api_versions(tuned, MONITORING_API_VERSIONS))
        if "alert" in r
    }
    assert "> 300" in by_name["CrmOutboxLag"]["expr"]
    assert "> 0.5" in by_name["CrmWebhookDeliveriesFailing"]["expr"]


def test_a_disabled_service_gets_no_alerts_about_it() -> None:
    values = {
        **scenario_values("monitoring"),
        "services": {"records": {"enabled": False}, "webhooks": {"enabled": False}},
    }
    rendered = render_with_api_versions(values, MONITORING_API_VERSIONS)
    names = {r["alert"] for r in _rules(rendered) if "alert" in r}
    assert "CrmOutboxLag" not in names
    assert "CrmWebhookDeliveriesFailing" not in names
    assert "CrmDatabasePoolSaturated" in names
    for rule in _rules(rendered):
        assert "crm-records" not in rule["expr"]
        assert "crm-webhooks" not in rule["expr"]


def test_dashboard_configmap_is_labelled_for_the_grafana_sidecar() -> None:
    assert render({}).find("ConfigMap", "crm-dashboard") is None
    rendered = render(scenario_values("monitoring"))  # no CRD needed
    config_map = rendered.get("ConfigMap", "crm-dashboard")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "CRM"}
    assert "namespace" not in config_map["metadata"]
    shipped = json.loads(DASHBOARD.read_text())
    assert json.loads(config_map["data"]["crm-overview.json"]) == shipped

    elsewhere = scenario_values("monitoring")
    elsewhere["metrics"]["grafanaDashboard"]["namespace"] = "monitoring"
    moved = render(elsewhere).get("ConfigMap", "crm-dashboard")
    assert moved["metadata"]["namespace"] == "monitoring"


def _grafana_free(expression: str) -> str:
    """A panel query with Grafana's variables replaced by what they stand for."""
    return expression.replace("$__rate_interval", "5m").replace("$namespace", "crm")


def test_dashboard_panels_query_documented_metrics_with_valid_promql() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "crm-overview"
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert variables == {"datasource", "namespace"}
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    used: set[str] = set()
    for panel in panels:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            try:
                names = metric_names(_grafana_free(target["expr"]))
            except ValueError as exc:
                raise AssertionError(f"{panel['title']}: {target['expr']!r}: {exc}") from None
            assert names <= documented_series(), (panel["title"], names - documented_series())
            used |= names
    # The dashboard covers what the issue asks to watch.
    for name in (
        "http_requests_total",
        "http_request_duration_seconds_bucket",
        "grpc_server_handled_total",
        "grpc_server_handling_seconds_bucket",
        "db_pool_connections_in_use",
        "records_outbox_relay_lag_seconds",
        "records_outbox_pending",
        "webhook_deliveries_total",
        "webhook_delivery_attempt_seconds_bucket",
        "workflow_runs_total",
        "gateway_subscriptions_open",
        "gateway_rate_limit_rejections_total",
        "gateway_revocation_checks_total",
    ):
        assert name in used, name

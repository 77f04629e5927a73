"""The Helm chart, rendered offline for the default values and every ci/*-values.yaml scenario."""

from __future__ import annotations

from typing import Any

import helm_python
import kubernetes_validate
import pytest
from helm_python import HelmReleaseError, HelmRenderError, HelmValuesError

from tests.chart.rendering import (
    CHART,
    GRPC_SERVICES,
    KUBE_VERSION,
    NAMESPACE,
    SERVICES,
    Rendered,
    container,
    env_of,
    merged_values,
    render,
    render_with_api_versions,
    scenario_names,
    scenario_values,
)

# Prometheus Operator kinds: kubernetes-validate has no schema for them (see test_monitoring).
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}


@pytest.fixture(scope="module", params=scenario_names())
def scenario(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any], Rendered]:
    name: str = request.param
    values = scenario_values(name)
    return name, merged_values(values), render(values)


def enabled(values: dict[str, Any]) -> list[str]:
    return [name for name in SERVICES if values["services"][name]["enabled"]]


def test_scenarios_cover_autoscaling_external_secrets_and_monitoring() -> None:
    assert {"default", "autoscaling", "external-secrets", "monitoring"} <= set(scenario_names())


def test_every_manifest_is_valid_for_kubernetes(
    scenario: tuple[str, dict[str, Any], Rendered],
) -> None:
    _, _, rendered = scenario
    assert rendered.objects
    for item in rendered.objects:
        if item["kind"] in CRD_KINDS:
            continue
        try:
            kubernetes_validate.validate(item, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            raise AssertionError(f"{item['kind']} {item['metadata']['name']}: {exc}") from None


@pytest.mark.parametrize("name", scenario_names())
def test_chart_lints_clean_in_strict_mode(name: str) -> None:
    report = helm_python.lint(
        CHART, scenario_values(name), strict=True, kube_version=f"v{KUBE_VERSION}"
    )
    assert report["errors"] == []
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert problems == []


def test_chart_requires_kubernetes_1_30() -> None:
    # Native gRPC probes and the preStop sleep action; older clusters are refused up front.
    with pytest.raises(HelmReleaseError, match="kubeVersion"):
        render_with_api_versions({}, [], kube_version="1.29.0")
    assert render_with_api_versions({}, [], kube_version="1.30.0").of_kind("Deployment")


def test_every_enabled_service_has_its_objects(
    scenario: tuple[str, dict[str, Any], Rendered],
) -> None:
    _, values, rendered = scenario
    for service in enabled(values):
        name = f"crm-{service}"
        deployment = rendered.get("Deployment", name)
        selector = deployment["spec"]["selector"]["matchLabels"]
        assert selector["app.kubernetes.io/component"] == service
        assert rendered.get("Service", name)["spec"]["selector"] == selector
        budget = rendered.get("PodDisruptionBudget", name)
        assert budget["spec"]["selector"]["matchLabels"] == selector
        account = rendered.get("ServiceAccount", name)
        assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == name
        assert account["automountServiceAccountToken"] is False


def test_replicas_are_rendered_only_without_an_autoscaler(
    scenario: tuple[str, dict[str, Any], Rendered],
) -> None:
    _, values, rendered = scenario
    scaled = {
        hpa["spec"]["scaleTargetRef"]["name"]: hpa
        for hpa in rendered.of_kind("HorizontalPodAutoscaler")
    }
    for service in enabled(values):
        settings = values["services"][service]
        deployment = rendered.get("Deployment", f"crm-{service}")
        if settings["autoscaling"]["enabled"]:
            assert "replicas" not in deployment["spec"]
            hpa = scaled[f"crm-{service}"]
            assert hpa["spec"]["scaleTargetRef"]["kind"] == "Deployment"
            assert hpa["spec"]["minReplicas"] == settings["autoscaling"]["minReplicas"]
            assert hpa["spec"]["maxReplicas"] == settings["autoscaling"]["maxReplicas"]
        else:
            assert deployment["spec"]["replicas"] == settings["replicas"]
            assert f"crm-{service}" not in scaled


def test_autoscaling_scenario_scales_every_service() -> None:
    rendered = render(scenario_values("autoscaling"))
    assert {h["metadata"]["name"] for h in rendered.of_kind("HorizontalPodAutoscaler")} == {
        f"crm-{s}" for s in SERVICES
    }
    gateway = rendered.get("HorizontalPodAutoscaler", "crm-gateway")
    metrics = {m["resource"]["name"]: m["resource"]["target"] for m in gateway["spec"]["metrics"]}
    assert metrics == {
        "cpu": {"type": "Utilization", "averageUtilization": 60},
        "memory": {"type": "Utilization", "averageUtilization": 80},
    }
    assert gateway["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 300
    records = rendered.get("PodDisruptionBudget", "crm-records")["spec"]
    assert records.get("minAvailable") == 1
    assert "maxUnavailable" not in records


def test_every_pod_reads_app_secret_from_the_same_secret(
    scenario: tuple[str, dict[str, Any], Rendered],
) -> None:
    _, values, rendered = scenario
    sources = set()
    for owner, pod in rendered.pod_specs():
        variable = env_of(container(pod))["APP_SECRET"]
        assert "value" not in variable, owner
        reference = variable["valueFrom"]["secretKeyRef"]
        sources.add((reference["name"], reference["key"]))
    assert len(sources) == 1, sources
    ((name, key),) = sources
    if values["appSecret"]["existingSecret"]:
        assert (name, key) == (
            values["appSecret"]["existingSecret"],
            values["appSecret"]["existingSecretKey"],
        )
        assert all("APP_SECRET" not in s.get("data", {}) for s in rendered.of_kind("Secret"))
    else:
        secret = rendered.get("Secret", name)
        assert len(secret["data"][key]) >= 16


def test_connection_urls_come_from_secrets_never_inline(
    scenario: tuple[str, dict[str, Any], Rendered],
) -> None:
    _, values, rendered = scenario
    expected = {"database": "DATABASE_URL", "redis": "REDIS_URL", "nats": "NATS_URL"}
    secrets = {s["metadata"]["name"]: s for s in rendered.of_kind("Secret")}
    for owner, pod in rendered.pod_specs():
        service = owner.removeprefix("crm-").removesuffix("-migrate")
        env = env_of(container(pod))
        for connection in values["services"][service]["connections"]:
            variable = env[expected[connection]]
            reference = variable["valueFrom"]["secretKeyRef"]
            settings = values[connection]
            if settings["existingSecret"]:
                assert reference == {
                    "name": settings["existingSecret"],
                    "key": settings["existingSecretKey"],
                }
            else:
                assert reference["key"] in secrets[reference["name"]]["data"], owner


def test_external_secrets_scenario_stores_no_secret_in_the_chart() -> None:
    rendered = render(scenario_values("external-secrets"))
    assert rendered.of_kind("Secret") == []
    ingress = rendered.get("Ingress", "crm-gateway")
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": "crm-gateway", "port": {"name": "http"}}
    assert ingress["spec"]["tls"][0]["secretName"] == "crm-example-com-tls"


def test_env_values_add_and_override_variables() -> None:
    rendered = render(scenario_values("external-secrets"))
    for service in SERVICES:
        env = env_of(
            container(rendered.get("Deployment", f"crm-{service}")["spec"]["template"]["spec"])
        )
        assert (
            env["OTEL_EXPORTER_OTLP_ENDPOINT"]["value"]
            == "http://otel-collector.observability:4318"
        )
        assert env["OTEL_SERVICE_NAME"]["value"] == service
        assert env["CRM_ENV"]["value"] == "production"
    records = env_of(
        container(rendered.get("Deployment", "crm-records")["spec"]["template"]["spec"])
    )
    assert records["LOG_LEVEL"]["value"] == "DEBUG"
    assert records["DB_POOL_MAX_SIZE"]["value"] == "20"
    identity = env_of(
        container(rendered.get("Deployment", "crm-identity")["spec"]["template"]["spec"])
    )
    assert identity["LOG_LEVEL"]["value"] == "INFO"
    assert identity["SMTP_URL"]["valueFrom"] == {"secretKeyRef": {"name": "crm-smtp", "key": "url"}}


def test_webhooks_refuse_private_targets_by_default() -> None:
    rendered = render({})
    env = env_of(container(rendered.get("Deployment", "crm-webhooks")["spec"]["template"]["spec"]))
    assert env["WEBHOOK_ALLOW_PRIVATE_TARGETS"]["value"] == "false"


def test_records_bound_the_event_stream() -> None:
    env = env_of(container(render({}).get("Deployment", "crm-records")["spec"]["template"]["spec"]))
    assert env["RECORD_STREAM_MAX_AGE"]["value"] == "7d"
    assert int(env["RECORD_STREAM_MAX_BYTES"]["value"]) > 0


def test_the_gateway_gets_the_rate_limit_settings() -> None:
    spec = render({}).get("Deployment", "crm-gateway")["spec"]["template"]["spec"]
    env = env_of(container(spec))
    assert env["API_RATE_LIMITING_TTL"]["value"] == "60000"
    assert env["API_RATE_LIMITING_LIMIT"]["value"] == "100"
    changed = render({"services": {"gateway": {"env": {"API_RATE_LIMITING_LIMIT": "500"}}}})
    spec = changed.get("Deployment", "crm-gateway")["spec"]["template"]["spec"]
    assert env_of(container(spec))["API_RATE_LIMITING_LIMIT"]["value"] == "500"


def test_peer_addresses_name_headless_services_of_the_release(
    scenario: tuple[str, dict[str, Any], Rendered],
) -> None:
    _, values, rendered = scenario
    grpc_port = values["ports"]["grpc"]
    for owner, pod in rendered.pod_specs():
        service = owner.removeprefix("crm-").removesuffix("-migrate")
        env = env_of(container(pod))
        for peer in values["services"][service]["peers"]:
            address = env[f"{peer.upper()}_ADDR"]["value"]
            assert address == f"dns:///crm-{peer}.{NAMESPACE}.svc.cluster.local:{grpc_port}"
            target = rendered.get("Service", f"crm-{peer}")["spec"]
            assert target["clusterIP"] == "None", "clients balance over pod addresses"
            assert grpc_port in [port["port"] for port in target["ports"]]


def test_probes_and_resources_are_set(scenario: tuple[str, dict[str, Any], Rendered]) -> None:
    _, values, rendered = scenario
    for service in enabled(values):
        spec = container(rendered.get("Deployment", f"crm-{service}")["spec"]["template"]["spec"])
        ports = {port["name"]: port["containerPort"] for port in spec["ports"]}
        probes = {kind: spec[f"{kind}Probe"] for kind in ("startup", "readiness", "liveness")}
        if service == "gateway":
            assert probes["readiness"]["httpGet"] == {"path": "/readyz", "port": "http"}
            assert probes["liveness"]["httpGet"] == {"path": "/livez", "port": "http"}
            assert probes["startup"]["httpGet"] == {"path": "/livez", "port": "http"}
            assert ports == {"http": values["ports"]["http"], "metrics": values["ports"]["metrics"]}
            assert env_of(spec)["PORT"]["value"] == str(ports["http"])
        else:
            for probe in probes.values():
                assert probe["grpc"] == {"port": ports["grpc"]}
            assert env_of(spec)["GRPC_PORT"]["value"] == str(ports["grpc"])
        assert env_of(spec)["METRICS_PORT"]["value"] == str(ports["metrics"])
        resources = spec["resources"]
        assert {"cpu", "memory"} <= set(resources["requests"]), service
        assert "memory" in resources["limits"], service


def test_pods_run_as_non_root_on_a_read_only_root_filesystem(
    scenario: tuple[str, dict[str, Any], Rendered],
) -> None:
    _, _, rendered = scenario
    for owner, pod in rendered.pod_specs():
        assert pod["securityContext"]["runAsNonRoot"] is True, owner
        assert pod["securityContext"]["runAsUser"] != 0, owner
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, owner
        assert pod["automountServiceAccountToken"] is False, owner
        assert pod["enableServiceLinks"] is False, owner
        spec = container(pod)
        security = spec["securityContext"]
        assert security["readOnlyRootFilesystem"] is True, owner
        assert security["allowPrivilegeEscalation"] is False, owner
        assert security["capabilities"]["drop"] == ["ALL"], owner
        mounts = {m["mountPath"]: m["name"] for m in spec["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert "emptyDir" in volumes[mounts["/tmp"]], owner


def test_migrations_run_as_pre_install_and_pre_upgrade_hooks(
    scenario: tuple[str, dict[str, Any], Rendered],
) -> None:
    _, values, rendered = scenario
    jobs = {job["metadata"]["name"]: job for job in rendered.of_kind("Job")}
    migrating = [s for s in enabled(values) if values["services"][s]["migrate"]]
    assert set(migrating) == set(GRPC_SERVICES)
    assert set(jobs) == {f"crm-{s}-migrate" for s in migrating}
    hook_weights = []
    for service in migrating:
        job = jobs[f"crm-{service}-migrate"]
        annotations = job["metadata"]["annotations"]
        assert set(annotations["helm.sh/hook"].split(",")) == {"pre-install", "pre-upgrade"}
        assert "hook-succeeded" in annotations["helm.sh/hook-delete-policy"]
        hook_weights.append(int(annotations["helm.sh/hook-weight"]))
        pod = job["spec"]["template"]["spec"]
        assert pod["restartPolicy"] == "Never"
        deployment = container(
            rendered.get("Deployment", f"crm-{service}")["spec"]["template"]["spec"]
        )
        assert container(pod)["image"] == deployment["image"]
        assert container(pod)["args"] == ["migrate"]
        # The service's settings load before migrating, so the Job gets the same environment.
        assert env_of(container(pod)) == env_of(deployment)
    for secret in rendered.of_kind("Secret"):
        annotations = secret["metadata"]["annotations"]
        assert set(annotations["helm.sh/hook"].split(",")) == {"pre-install", "pre-upgrade"}
        assert int(annotations["helm.sh/hook-weight"]) < min(hook_weights), "Secret before Jobs"


def test_images_follow_repository_and_tag_values() -> None:
    rendered = render(
        {
            "image": {"repository": "registry.example.com/team/crm", "tag": "1.2.3"},
            "services": {
                "records": {"image": {"repository": "mirror.example.com/records", "tag": "1.2.4"}}
            },
        }
    )
    images = {owner: container(pod)["image"] for owner, pod in rendered.pod_specs()}
    assert images["crm-gateway"] == "registry.example.com/team/crm-gateway:1.2.3"
    assert images["crm-records"] == "mirror.example.com/records:1.2.4"
    assert images["crm-records-migrate"] == "mirror.example.com/records:1.2.4"
    default = render({})
    assert (
        container(default.get("Deployment", "crm-gateway")["spec"]["template"]["spec"])["image"]
        == "crm-gateway:0.1.0"
    )


def test_changing_a_connection_url_rolls_the_pods() -> None:
    def checksum(url: str) -> str:
        rendered = render({"database": {"url": url}})
        deployment = rendered.get("Deployment", "crm-records")
        annotation: str = deployment["spec"]["template"]["metadata"]["annotations"][
            "checksum/secret"
        ]
        return annotation

    first = checksum("postgresql://crm@db-a:5432/crm")
    assert first == checksum("postgresql://crm@db-a:5432/crm")
    assert first != checksum("postgresql://crm@db-b:5432/crm")


def test_a_disabled_service_gets_no_objects_and_no_peer_address() -> None:
    rendered = render(
        {
            "services": {
                "workflows": {"enabled": False},
                "gateway": {"env": {"WORKFLOWS_ADDR": "workflows.elsewhere:50051"}},
            }
        }
    )
    names = {item["metadata"]["name"] for item in rendered.objects}
    assert not {n for n in names if "workflows" in n}
    gateway = env_of(
        container(rendered.get("Deployment", "crm-gateway")["spec"]["template"]["spec"])
    )
    assert gateway["WORKFLOWS_ADDR"]["value"] == "workflows.elsewhere:50051"


def test_unknown_or_mistyped_values_are_rejected() -> None:
    with pytest.raises(HelmValuesError, match="replica"):
        render({"services": {"gateway": {"replica": 3}}})
    with pytest.raises(HelmValuesError, match="unknownService"):
        render({"services": {"unknownService": {"enabled": True}}})
    with pytest.raises(HelmValuesError, match="appSecret"):
        render({"appSecret": {"value": "too-short"}})
    with pytest.raises(HelmValuesError, match="DB_POOL_MAX_SIZE"):
        render({"services": {"records": {"env": {"DB_POOL_MAX_SIZE": 20}}}})
    with pytest.raises(HelmValuesError, match="database"):
        render({"database": {"url": "mysql://db/crm"}})


def test_a_connection_without_url_or_secret_fails_naming_it() -> None:
    with pytest.raises(HelmRenderError, match=r"redis\.url or redis\.existingSecret must be set"):
        render({"redis": {"url": ""}})


def test_notes_tell_how_to_reach_the_gateway_and_sign_up() -> None:
    notes = render({}).notes
    assert "port-forward svc/crm-gateway 3000:80" in notes
    assert "POST $CRM_URL/auth/signup" in notes
    for field in ("email", "password", "firstName", "lastName", "workspaceName"):
        assert f'"{field}"' in notes
    assert "/auth/login" in notes
    with_ingress = render(scenario_values("external-secrets")).notes
    assert "https://crm.example.com" in with_ingress

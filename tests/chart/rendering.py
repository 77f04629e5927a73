"""The chart rendered offline (helm-python-sdk), as parsed objects the tests can query."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from helm_python import Chart

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "crm"
RELEASE = "crm"
NAMESPACE = "crm"
KUBE_VERSION = "1.33.0"
SERVICES = ("gateway", "identity", "metadata", "records", "webhooks", "workflows")
GRPC_SERVICES = SERVICES[1:]
MONITORING_API_VERSIONS = (
    "monitoring.coreos.com/v1/ServiceMonitor",
    "monitoring.coreos.com/v1/PrometheusRule",
    "monitoring.coreos.com/v1",
)


@dataclass(frozen=True)
class Rendered:
    objects: list[dict[str, Any]]
    notes: str

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [item for item in self.objects if item["kind"] == kind]

    def get(self, kind: str, name: str) -> dict[str, Any]:
        for item in self.of_kind(kind):
            if item["metadata"]["name"] == name:
                return item
        raise AssertionError(
            f"no {kind} {name}; have {[i['metadata']['name'] for i in self.of_kind(kind)]}"
        )

    def find(self, kind: str, name: str) -> dict[str, Any] | None:
        return next((i for i in self.of_kind(kind) if i["metadata"]["name"] == name), None)

    def pod_specs(self) -> list[tuple[str, dict[str, Any]]]:
        """(owner name, pod spec) of every Deployment and Job."""
        return [
            (item["metadata"]["name"], item["spec"]["template"]["spec"])
            for item in self.objects
            if item["kind"] in ("Deployment", "Job")
        ]


def scenario_names() -> list[str]:
    """`default` plus every ci/<name>-values.yaml scenario of the chart."""
    names = sorted(
        p.name.removesuffix("-values.yaml") for p in (CHART / "ci").glob("*-values.yaml")
    )
    return ["default", *names]


def scenario_values(name: str) -> dict[str, Any]:
    if name == "default":
        return {}
    values: dict[str, Any] = yaml.safe_load((CHART / "ci" / f"{name}-values.yaml").read_text())
    return values


def merged_values(values: dict[str, Any]) -> dict[str, Any]:
    """The chart's defaults coalesced with `values`, as an install would use them."""
    merged: dict[str, Any] = Chart.load(CHART).merge_values(values)
    return merged


def _parse(documents: Iterable[str]) -> list[dict[str, Any]]:
    objects = []
    for text in documents:
        for item in yaml.safe_load_all(text):
            if isinstance(item, dict):
                objects.append(item)
    return objects


def render(values: dict[str, Any]) -> Rendered:
    """Every template, hooks included, as `helm template` would render them (no CRDs known)."""
    manifests = Chart.load(CHART).render(values, name=RELEASE, namespace=NAMESPACE)
    notes = next((text for path, text in manifests.items() if path.endswith("NOTES.txt")), "")
    return Rendered(
        _parse(text for path, text in manifests.items() if not path.endswith("NOTES.txt")), notes
    )


def render_with_api_versions(
    values: dict[str, Any], api_versions: Sequence[str], kube_version: str = KUBE_VERSION
) -> Rendered:
    """The release manifest (hooks excluded) of a client-only install on a cluster of
    `kube_version` that serves `api_versions` besides the built-in ones, like
    `helm install --dry-run --api-versions ... --kube-version ...`.

    helm-python-sdk 0.2.2 (pinned in requirements/dev.txt) exposes no API-versions option on
    Chart.render() or Config.install(), but its native install entry point accepts Helm's
    `api_versions` and `kube_version` options, so this calls that entry point directly. A
    test renders the same values with and without the API versions and expects a difference,
    so a library that stopped honouring the option fails loudly instead of passing vacuously.
    """
    from helm_python import Config, _native
    from helm_python.config import _NONE, _opts

    with Config(namespace=NAMESPACE, storage_driver="memory") as config:
        payload = _native.call_string(
            "helm_install",
            config._raw(),
            config._context_arg(None),
            _native.HANDLE(_NONE),
            str(CHART),
            RELEASE,
            json.dumps(values),
            _opts(
                namespace=NAMESPACE,
                dry_run="client",
                api_versions=list(api_versions),
                kube_version=f"v{kube_version}",
            ),
        )
    release = json.loads(payload)
    return Rendered(_parse([release["manifest"]]), release.get("notes", ""))


def container(pod_spec: dict[str, Any]) -> dict[str, Any]:
    containers: list[dict[str, Any]] = pod_spec["containers"]
    assert len(containers) == 1, [c["name"] for c in containers]
    return containers[0]


def env_of(container_spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """name -> the EnvVar, failing on a name listed twice (the later would silently win)."""
    entries: list[dict[str, Any]] = container_spec.get("env", [])
    names = [entry["name"] for entry in entries]
    assert len(names) == len(set(names)), f"duplicate env names: {names}"
    return {entry["name"]: entry for entry in entries}

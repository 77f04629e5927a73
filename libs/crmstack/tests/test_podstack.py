"""The pure parts of `make images` (podman settings, mirror) and `make container-test` (the
translation of the chart's manifests for `podman kube play`)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import yaml

from crmstack import engine, podstack

ROOT = Path(__file__).resolve().parents[3]


def test_the_mirror_is_read_from_the_apt_sources(tmp_path: Path) -> None:
    sources = tmp_path / "debian.sources"
    sources.write_text(
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n\n"
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm\n"
    )
    assert engine.apt_mirror(sources, tmp_path / "none") == "http://mirror.example/debian"
    legacy = tmp_path / "sources.list"
    legacy.write_text("deb [arch=amd64] http://legacy.example/debian bookworm main\n")
    assert engine.apt_mirror(tmp_path / "none", legacy) == "http://legacy.example/debian"


def test_podman_settings_stay_within_the_machines_limits(tmp_path: Path) -> None:
    conf = engine.containers_conf(nofile_hard=20000)
    assert 'default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]' in conf
    for line in ('runtime = "runc"', 'cgroup_manager = "cgroupfs"', 'events_logger = "file"'):
        assert line in conf
    storage = engine.storage_conf(tmp_path)
    assert f'graphroot = "{tmp_path / "storage"}"' in storage
    assert f'runroot = "{tmp_path / "run"}"' in storage


def test_builds_mount_the_hosts_ca_bundle_and_pip_config_read_only() -> None:
    options = engine.build_args(engine.Engine("podman", {}))
    assert options[:2] == ["--network", "host"]
    for path in engine.BUILD_MOUNTS:
        if Path(path).exists():
            assert f"{path}:{path}:ro" in options
    assert engine.build_args(engine.Engine("docker", {})) == []


def test_the_secret_becomes_the_flat_json_kube_play_reads() -> None:
    secret = {"data": {"A": base64.b64encode(b"x").decode()}, "stringData": {"B": "y"}}
    assert json.loads(podstack.secret_payload(secret)) == {"A": "eA==", "B": "eQ=="}


def scenario() -> list[dict[str, Any]]:
    return podstack.render(ROOT, podstack.scenario_values(ROOT))


def test_migration_jobs_become_pods_that_run_once() -> None:
    objects = scenario()
    jobs = podstack.of_kind(objects, "Job")
    assert len(jobs) == 5  # every service but the gateway migrates
    for job in jobs:
        pod = podstack.job_as_pod(job)
        assert pod["kind"] == "Pod"
        assert pod["spec"]["restartPolicy"] == "Never"
        assert pod["spec"]["containers"][0]["args"] == ["migrate"]


def test_only_the_gateway_port_is_published_and_only_on_loopback() -> None:
    objects = scenario()
    for deployment in podstack.of_kind(objects, "Deployment"):
        (plain,) = podstack.translate_deployment(
            deployment,
            gateway_port=None,
            http_port=3000,
        )["spec"]["template"]["spec"]["containers"]
        assert "ports" not in plain
        (published,) = podstack.translate_deployment(
            deployment,
            gateway_port=40000,
            http_port=3000,
        )["spec"]["template"]["spec"]["containers"]
        assert published["ports"] == [
            {"containerPort": 3000, "hostIP": "127.0.0.1", "hostPort": 40000}
        ]


def test_pods_get_their_service_names_as_network_aliases() -> None:
    objects = scenario()
    (records,) = [
        d for d in podstack.of_kind(objects, "Deployment") if d["metadata"]["name"] == "crm-records"
    ]
    aliases = podstack.service_aliases(objects, records)
    assert aliases == ["crm-records", "crm-records.crm", "crm-records.crm.svc.cluster.local"]
    addresses = {
        e["name"]: e.get("value")
        for d in podstack.of_kind(objects, "Deployment")
        for e in d["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert addresses["RECORDS_ADDR"] == "dns:///crm-records.crm.svc.cluster.local:50051"


def test_the_scenario_gives_the_stack_the_suites_settings() -> None:
    """tests/integration's TEST_ENV, except what points at the host running the suite."""
    from crmstack.deploy import suite_env

    wanted = {k: v for k, v in suite_env().items() if k != "TRUSTED_PROXIES"}
    for deployment in podstack.of_kind(scenario(), "Deployment"):
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert {k: env.get(k) for k in wanted} == wanted, deployment["metadata"]["name"]
        assert "127.0.0.1/32" in env["TRUSTED_PROXIES"]


def test_kube_play_output_names_the_pods() -> None:
    output = "Pod:\nabc123\nContainer:\ndef456\n\nPod:\n789\nContainer:\n0ab\n"
    assert podstack.played_pods(output) == ["abc123", "789"]


def test_the_values_scenario_is_a_chart_ci_scenario() -> None:
    values = yaml.safe_load((ROOT / podstack.VALUES).read_text())
    assert values["services"]["records"]["replicas"] == 2
    assert podstack.VALUES.startswith("deploy/helm/crm/ci/")

"""`make images` and `make kind-test` without Docker or kind: one clear line, no traceback."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import yaml

from crmstack import deploy, engine


def _fake_tool(folder: Path, name: str, script: str) -> None:
    path = folder / name
    path.write_text("#!/bin/sh\n" + script + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def bin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir()
    monkeypatch.setenv("PATH", str(folder))
    return folder


def test_kind_test_without_docker_stops_with_one_line(
    bin_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert deploy.main(["kind-test"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err == "make kind-test: no Docker here: the `docker` command is not on PATH\n"


def test_kind_test_names_a_docker_client_without_engine(
    bin_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _fake_tool(bin_dir, "docker", "echo 'Cannot connect to the Docker daemon' >&2; exit 1")
    assert deploy.main(["kind-test"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "make kind-test: no Docker engine answers: `docker info` failed "
        "(Cannot connect to the Docker daemon)\n"
    )


def test_images_without_docker_or_a_way_to_podman_says_why(
    bin_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _fake_tool(bin_dir, "docker", "echo 'Cannot connect to the Docker daemon' >&2; exit 1")
    assert deploy.main(["images"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    reason = (
        "podman is not installed and apt-get is not available to install it"
        if os.geteuid() == 0
        else "podman is not installed and installing it needs root"
    )
    assert err == f"make images: no Docker engine answers and {reason}\n"


def test_kind_test_names_a_missing_kind(bin_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _fake_tool(bin_dir, "docker", "echo 28.2.2")
    assert deploy.main(["kind-test"]) == 2
    err = capsys.readouterr().err
    assert err == "make kind-test: `kind` is not on PATH; it creates the cluster\n"


ROOT = Path(__file__).resolve().parents[3]


def test_kind_values_name_the_image_tag_the_images_are_built_with() -> None:
    values = deploy.kind_values(ROOT)
    assert values["image"]["tag"] == "kind"
    assert values["image"]["repository"] == engine.IMAGE_REPOSITORY
    assert os.path.isfile(ROOT / deploy.KIND_CONFIG)
    assert os.path.isfile(ROOT / deploy.KIND_INFRA)


def test_the_cluster_gets_the_settings_the_suite_relies_on() -> None:
    from helm_python import Chart

    manifests = Chart.load(ROOT / "deploy/helm/crm").render(
        deploy.kind_values(ROOT), name="crm", namespace="crm"
    )
    deployments = [
        item
        for path, text in manifests.items()
        if path.endswith(".yaml")
        for item in yaml.safe_load_all(text)
        if isinstance(item, dict) and item["kind"] == "Deployment"
    ]
    assert len(deployments) == 6
    suite = deploy.suite_env()
    assert suite["WEBHOOK_ALLOW_PRIVATE_TARGETS"] == "true"
    assert "SMTP_URL" not in suite
    for deployment in deployments:
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        for key, value in suite.items():
            assert env[key] == value, (deployment["metadata"]["name"], key)

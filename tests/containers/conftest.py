"""The stack `make container-test` started from the chart's manifests (crmstack.podstack).

The run writes what it started to the file CRM_CONTAINER_STACK names: the rendered manifests,
each Deployment's pods, the network, the gateway's URL and the podman configuration.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from crmstack.podstack import STATE_ENV


@dataclass(frozen=True)
class ContainerStack:
    manifests: list[dict[str, Any]]
    pods: dict[str, list[str]]
    base_url: str
    env: dict[str, str]

    def podman(self, *args: str, timeout: float = 120) -> str:
        result = subprocess.run(
            ["podman", *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )
        assert result.returncode == 0, f"podman {' '.join(args)}: {result.stderr[-500:]}"
        return result.stdout

    def inspect(self, what: str, name: str) -> dict[str, Any]:
        found = json.loads(self.podman(what, "inspect", name))
        item: dict[str, Any] = found[0] if isinstance(found, list) else found
        return item

    def containers_of(self, deployment: str) -> list[str]:
        """The app containers of the Deployment's pods (kube play names them <pod>-<container>)."""
        names = []
        for pod in self.pods[deployment]:
            info = self.inspect("pod", pod)
            infra = info.get("InfraContainerID", "")
            names += [c["Name"] for c in info["Containers"] if c["Id"] != infra]
        return names

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [item for item in self.manifests if item["kind"] == kind]


@pytest.fixture(scope="session")
def container_stack() -> ContainerStack:
    state_file = os.environ.get(STATE_ENV)
    if not state_file:
        pytest.skip("needs the stack `make container-test` starts (podman)")
    state = json.loads(Path(state_file).read_text())
    manifests = [
        item
        for item in yaml.safe_load_all(Path(state["manifests"]).read_text())
        if isinstance(item, dict)
    ]
    env = dict(
        os.environ,
        CONTAINERS_CONF=state["containers_conf"],
        CONTAINERS_STORAGE_CONF=state["storage_conf"],
    )
    return ContainerStack(manifests, state["pods"], state["base_url"], env)


@pytest.fixture(scope="session")
def http(container_stack: ContainerStack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=container_stack.base_url, timeout=30) as client:
        yield client

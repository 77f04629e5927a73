"""The running containers got exactly what the rendered chart states: image, command, env
(literal values and Secret references), volumes, user, read-only root, capabilities, limits."""

from __future__ import annotations

import base64
import re
from typing import Any

from tests.containers.conftest import ContainerStack

UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "K": 10**3, "M": 10**6, "G": 10**9, "": 1}


def quantity(text: str) -> int:
    match = re.fullmatch(r"(\d+)([KMG]i?)?", text)
    assert match is not None, text
    return int(match.group(1)) * UNITS[match.group(2) or ""]


def short_image(name: str) -> str:
    return name.removeprefix("localhost/").removeprefix("docker.io/library/")


def secret_values(stack: ContainerStack) -> dict[str, dict[str, str]]:
    return {
        secret["metadata"]["name"]: {
            key: base64.b64decode(value).decode() for key, value in secret["data"].items()
        }
        for secret in stack.of_kind("Secret")
    }


def expected_argv(stack: ContainerStack, spec: dict[str, Any], image: str) -> list[str]:
    config = stack.inspect("image", image)["Config"]
    command = spec.get("command") or config.get("Entrypoint") or []
    args = spec.get("args") or ([] if spec.get("command") else config.get("Cmd") or [])
    return [*command, *args]


def test_every_deployment_runs_its_replicas_with_what_the_manifest_states(
    container_stack: ContainerStack,
) -> None:
    secrets = secret_values(container_stack)
    deployments = container_stack.of_kind("Deployment")
    assert {d["metadata"]["name"] for d in deployments} == set(container_stack.pods)
    for deployment in deployments:
        name = deployment["metadata"]["name"]
        pod_spec = deployment["spec"]["template"]["spec"]
        (spec,) = pod_spec["containers"]
        running = container_stack.containers_of(name)
        assert len(running) == deployment["spec"]["replicas"], (name, running)
        for container in running:
            info = container_stack.inspect("container", container)
            where = f"{name}/{container}"
            assert info["State"]["Running"], where
            assert short_image(info["ImageName"]) == short_image(spec["image"]), where
            argv = [info["Path"], *info["Args"]]
            assert argv == expected_argv(container_stack, spec, info["Image"]), where

            env = dict(item.split("=", 1) for item in info["Config"]["Env"])
            for entry in spec["env"]:
                if "value" in entry:
                    assert env.get(entry["name"]) == entry["value"], (where, entry["name"])
                else:
                    ref = entry["valueFrom"]["secretKeyRef"]
                    assert env.get(entry["name"]) == secrets[ref["name"]][ref["key"]], (
                        where,
                        entry["name"],
                    )

            mounts = {mount["Destination"]: mount for mount in info["Mounts"]}
            for mount in spec["volumeMounts"]:
                assert mount["mountPath"] in mounts, (where, mount)
                assert mounts[mount["mountPath"]]["RW"] is not mount.get("readOnly", False)

            security = {**pod_spec["securityContext"], **spec["securityContext"]}
            host = info["HostConfig"]
            assert host["ReadonlyRootfs"] is security["readOnlyRootFilesystem"], where
            user = info["Config"]["User"].split(":")
            assert user[0] == str(security["runAsUser"]), (where, user)
            if len(user) > 1:
                assert user[1] == str(security["runAsGroup"]), (where, user)
            if security["capabilities"]["drop"] == ["ALL"]:
                assert not info["EffectiveCaps"], (where, info["EffectiveCaps"])
            if security["allowPrivilegeEscalation"] is False:
                assert "no-new-privileges" in " ".join(host.get("SecurityOpt") or []), where
            memory = spec["resources"]["limits"]["memory"]
            assert host["Memory"] == quantity(memory), (where, host["Memory"], memory)


def test_the_processes_run_as_the_charts_user_on_a_read_only_root(
    container_stack: ContainerStack,
) -> None:
    for deployment in container_stack.of_kind("Deployment"):
        uid = deployment["spec"]["template"]["spec"]["securityContext"]["runAsUser"]
        for container in container_stack.containers_of(deployment["metadata"]["name"]):
            assert container_stack.podman("exec", container, "id", "-u").strip() == str(uid)
            check = "touch /opt/crm/x 2>/dev/null && echo writable || echo read-only; " \
                "touch /tmp/x && rm /tmp/x && echo tmp-writable"  # fmt: skip
            out = container_stack.podman("exec", container, "sh", "-c", check).split()
            assert out == ["read-only", "tmp-writable"], (container, out)

"""`make images` and `make kind-test`: the service images, and the chart on a kind cluster.

images: every service's image from deploy/images/Dockerfile, with Docker where an engine answers
and podman otherwise (crmstack.engine; `make container-test` runs them, crmstack.podstack).

kind-test: create a kind cluster from deploy/kind/cluster.yaml, build and load the images, apply
the infrastructure (deploy/kind/infra.yaml), install the chart with deploy/kind/values.yaml,
upgrade it once (the pre-upgrade migration hooks run again and the generated APP_SECRET must
survive), port-forward the gateway and run tests/integration against it with CRM_BASE_URL.
The cluster is deleted afterwards unless KEEP_CLUSTER=1 (a kept cluster is reused next time).
Without a Docker engine, kind or kubectl it stops at once with one line saying what is missing.
"""

from __future__ import annotations

import argparse
import base64
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from crmstack import engine
from crmstack.engine import EngineError, run, wait_healthy
from crmstack.ports import free_port
from crmstack.processes import say
from crmstack.stack import ALL_SERVICES

CHART = "deploy/helm/crm"
KIND_CONFIG = "deploy/kind/cluster.yaml"
KIND_INFRA = "deploy/kind/infra.yaml"
KIND_VALUES = "deploy/kind/values.yaml"


def require_docker() -> None:
    """Fail with one line unless a Docker engine answers."""
    if shutil.which("docker") is None:
        raise EngineError("no Docker here: the `docker` command is not on PATH")
    try:
        result = subprocess.run(
            ["docker", "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except subprocess.TimeoutExpired:
        raise EngineError("no Docker engine answers: `docker info` timed out") from None
    if result.returncode != 0 or not result.stdout.strip():
        reason = (result.stderr.strip().splitlines() or ["no answer"])[-1]
        raise EngineError(f"no Docker engine answers: `docker info` failed ({reason})")


def require_tool(name: str, why: str) -> None:
    if shutil.which(name) is None:
        raise EngineError(f"`{name}` is not on PATH; it {why}")


def output(command: Sequence[str], *, timeout: float = 120) -> str:
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise EngineError(f"`{' '.join(command[:3])} ...` failed: {result.stderr.strip()[-300:]}")
    return result.stdout


def build_images(root: Path, tag: str) -> list[str]:
    """docker build every service's image (kind loads images from Docker); returns the names."""
    require_docker()
    return engine.build_services(engine.engine(root), root, ALL_SERVICES, tag)


@dataclass
class KindCluster:
    """One kind cluster, reached through its own kubeconfig context."""

    name: str
    root: Path

    @property
    def context(self) -> str:
        return f"kind-{self.name}"

    def exists(self) -> bool:
        return self.name in output(["kind", "get", "clusters"]).split()

    def create(self) -> None:
        run(
            ["kind", "create", "cluster", "--name", self.name, "--config", KIND_CONFIG],
            cwd=self.root,
        )

    def delete(self) -> None:
        run(["kind", "delete", "cluster", "--name", self.name])

    def load(self, images: Sequence[str]) -> None:
        run(["kind", "load", "docker-image", "--name", self.name, *images])

    def kubeconfig(self) -> str:
        return output(["kind", "get", "kubeconfig", "--name", self.name])

    def kubectl(self, *args: str, timeout: float = 600) -> None:
        run(["kubectl", "--context", self.context, *args], cwd=self.root, timeout=timeout)

    def kubectl_output(self, *args: str) -> str:
        return output(["kubectl", "--context", self.context, *args])


@dataclass
class Release:
    """The chart installed in the cluster through helm-python-sdk (no helm binary needed)."""

    cluster: KindCluster
    name: str
    namespace: str

    def deploy(self, values: dict[str, Any]) -> None:
        """Install the release, or upgrade it when it exists; waits for rollouts and hooks."""
        from helm_python import Config, HelmNotFoundError

        chart = str(self.cluster.root / CHART)
        with Config(
            kubeconfig_content=self.cluster.kubeconfig(), namespace=self.namespace
        ) as config:
            try:
                config.status(self.name)
                exists = True
            except HelmNotFoundError:
                exists = False
            action = "upgrade" if exists else "install"
            say(f"helm {action} {self.name} (waits for the migration hooks and every rollout)")
            wait: dict[str, Any] = {"namespace": self.namespace, "wait": "watcher", "timeout": 900}
            try:
                if exists:
                    config.upgrade(chart, self.name, values, **wait)
                else:
                    config.install(chart, self.name, values, create_namespace=True, **wait)
            except Exception as exc:
                raise EngineError(f"helm {action} failed: {str(exc).strip()[:500]}") from None

    def app_secret(self) -> str:
        encoded = self.cluster.kubectl_output(
            "-n", self.namespace, "get", "secret", self.name, "-o", "jsonpath={.data.APP_SECRET}"
        )
        return base64.b64decode(encoded).decode()


def diagnose(cluster: KindCluster, namespace: str) -> None:
    """What went wrong, for the CI log: pods, recent events, logs of pods that are not ready."""
    for args in (
        ("-n", namespace, "get", "pods,jobs,svc", "-o", "wide"),
        ("-n", namespace, "get", "events", "--sort-by=.lastTimestamp"),
        (
            "-n",
            namespace,
            "logs",
            "-l",
            "app.kubernetes.io/part-of=crm",
            "--all-containers",
            "--prefix",
            "--tail=80",
        ),
    ):
        try:
            cluster.kubectl(*args, timeout=60)
        except EngineError as exc:
            say(f"(diagnostics: {exc})")


# TEST_ENV entries that point at the host running the suite (its loopback SMTP listener): the
# tests that use them need the local stack and skip against a cluster.
HOST_ONLY_TEST_ENV = frozenset({"SMTP_URL"})


def suite_env() -> dict[str, str]:
    """The settings tests/integration relies on (its TEST_ENV), as the cluster can honour them."""
    from tests.integration.conftest import TEST_ENV

    return {key: value for key, value in TEST_ENV.items() if key not in HOST_ONLY_TEST_ENV}


def kind_values(root: Path) -> dict[str, Any]:
    """deploy/kind/values.yaml plus the suite's TEST_ENV in every service's env, as the local
    launcher gives it to every process. Its image tag is the tag the images are built with."""
    values: dict[str, Any] = yaml.safe_load((root / KIND_VALUES).read_text())
    if not values.get("image", {}).get("tag"):
        raise EngineError(f"{KIND_VALUES} must set image.tag")
    services = values.setdefault("services", {})
    for service in ALL_SERVICES:
        settings = services.setdefault(service, {})
        settings["env"] = {**settings.get("env", {}), **suite_env()}
    return values


def kind_test(
    root: Path, *, cluster_name: str, namespace: str, keep: bool, pytest_args: Sequence[str]
) -> int:
    require_docker()
    require_tool("kind", "creates the cluster")
    require_tool("kubectl", "applies the infrastructure and port-forwards the gateway")
    cluster = KindCluster(cluster_name, root)
    values = kind_values(root)
    # A tag of its own per run: a reused cluster (KEEP_CLUSTER=1) then rolls to the new images.
    values["image"]["tag"] += time.strftime("-%Y%m%d%H%M%S")
    images = build_images(root, values["image"]["tag"])
    if cluster.exists():
        say(f"reusing kind cluster {cluster_name}")
    else:
        cluster.create()
    forward: subprocess.Popen[bytes] | None = None
    try:
        cluster.load(images)
        cluster.kubectl("apply", "-f", KIND_INFRA)
        for infra in ("postgresql", "redis", "nats"):
            cluster.kubectl(
                "-n", namespace, "rollout", "status", f"deployment/{infra}", "--timeout=300s"
            )
        release = Release(cluster, "crm", namespace)
        release.deploy(values)
        secret = release.app_secret()
        release.deploy(values)  # an upgrade: migrations run again, APP_SECRET must stay
        if release.app_secret() != secret:
            raise EngineError("helm upgrade replaced the generated APP_SECRET")
        port = free_port()
        command = [
            "kubectl",
            "--context",
            cluster.context,
            "-n",
            namespace,
            "port-forward",
            "svc/crm-gateway",
            f"{port}:80",
        ]
        say("$ " + " ".join(command))
        forward = subprocess.Popen(command, stdout=subprocess.DEVNULL)
        base_url = f"http://127.0.0.1:{port}"
        wait_healthy(base_url, timeout=120)
        say(f"running tests/integration against {base_url}")
        env = dict(os.environ, CRM_BASE_URL=base_url)
        code = subprocess.run(
            [sys.executable, "-m", "pytest", "tests/integration", "-q", *pytest_args],
            cwd=root,
            env=env,
        ).returncode
        if code != 0:
            diagnose(cluster, namespace)
        return code
    except EngineError:
        diagnose(cluster, namespace)
        raise
    finally:
        if forward is not None:
            forward.terminate()
            forward.wait(timeout=10)
        if keep:
            say(
                f"keeping kind cluster {cluster_name} (KEEP_CLUSTER=1); delete it with "
                f"`kind delete cluster --name {cluster_name}`"
            )
        else:
            cluster.delete()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m crmstack.deploy", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    images = commands.add_parser(
        "images", help="build crm-<service>:<tag> for every service (Docker, else podman)"
    )
    images.add_argument("--tag", default="dev")
    kind = commands.add_parser("kind-test", help="the integration suite on a kind cluster")
    kind.add_argument("--cluster", default=os.environ.get("KIND_CLUSTER", "crm-kind"))
    kind.add_argument("--namespace", default="crm")
    kind.add_argument("pytest_args", nargs="*", help="passed on to pytest")
    args = parser.parse_args(argv)
    root = Path.cwd()
    try:
        if args.command == "images":
            built = engine.engine(root)
            names = engine.build_services(built, root, ALL_SERVICES, args.tag)
            for name in names:
                say(f"built {name} ({built.image_size(name) / 1e6:.0f} MB, {built.command})")
            return 0
        return kind_test(
            root,
            cluster_name=args.cluster,
            namespace=args.namespace,
            keep=os.environ.get("KEEP_CLUSTER") == "1",
            pytest_args=args.pytest_args,
        )
    except (EngineError, engine.EngineError) as exc:
        sys.stderr.write(f"make {args.command}: {exc}\n")
        return 2


if __name__ == "__main__":
    raise SystemExit(main())

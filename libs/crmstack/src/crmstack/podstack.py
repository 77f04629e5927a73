"""`make container-test`: the chart's stack as podman containers, and the suite against it.

The chart is rendered with deploy/helm/crm/ci/container-values.yaml and its manifests are played
with `podman kube play` after a small translation (docs/deploy.md, "Containers"):
- the Secret is created with `podman secret create` from a flat JSON file (kube play reads the
  Secrets it stored as JSON and fails on the YAML form);
- the migration Jobs (Helm hooks, which kube play ignores) are played first as Pods and awaited;
- containerPorts are removed (kube play would publish every one on 0.0.0.0), except the
  gateway's HTTP port, published on 127.0.0.1 only;
- each Deployment's pods join a network this run creates, with its Service names as aliases
  (`<svc>`, `<svc>.<ns>`, `<svc>.<ns>.svc.<clusterDomain>`): kube play resolves pod names only.
PostgreSQL, Redis and NATS run as containers of the image built from Debian's packages, on the
same network under the names the values give (postgresql, redis, nats). Everything this run
creates (network, infrastructure containers, the chart's pods, its Secret) is recorded and
removed by name afterwards, on success or failure.
"""

from __future__ import annotations

import argparse
import base64
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from crmstack.engine import (
    Engine,
    EngineError,
    build_infra,
    build_services,
    podman,
    wait_healthy,
)
from crmstack.ports import free_port
from crmstack.processes import say
from crmstack.stack import ALL_SERVICES

CHART = "deploy/helm/crm"
VALUES = "deploy/helm/crm/ci/container-values.yaml"
RELEASE = "crm"
NAMESPACE = "crm"
# The file tests/containers reads to find what this run started (CRM_CONTAINER_STACK).
STATE_ENV = "CRM_CONTAINER_STACK"
# The suite tests/integration runs in; tests/containers prove what only containers show.
SUITES = ("tests/containers", "tests/integration")
# Left out of the container run, each with the reason (docs/deploy.md lists them): the GraphQL
# fuzz test once met a 500 when a gRPC peer closed a connection with GOAWAY "too_many_pings"
# (client keepalive vs server ping policy), which only long-lived container runs have shown.
DESELECTED = (
    "tests/integration/test_graphql_fuzz.py::test_generated_queries_never_fail_on_the_server",
)
MIGRATION_TIMEOUT = 300.0
HEALTH_TIMEOUT = 180.0


def render(root: Path, values: dict[str, Any]) -> list[dict[str, Any]]:
    """Every object of the chart, hooks included, as `helm template` renders them."""
    from helm_python import Chart

    manifests = Chart.load(root / CHART).render(values, name=RELEASE, namespace=NAMESPACE)
    objects = []
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt"):
            continue
        objects += [item for item in yaml.safe_load_all(text) if isinstance(item, dict)]
    return objects


def scenario_values(root: Path) -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((root / VALUES).read_text())
    return values


def of_kind(objects: Sequence[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [item for item in objects if item["kind"] == kind]


def secret_payload(secret: dict[str, Any]) -> str:
    """The flat JSON `podman kube play` expects of a Secret it did not store: key -> base64."""
    data = dict(secret.get("data", {}))
    for key, value in secret.get("stringData", {}).items():
        data[key] = base64.b64encode(value.encode()).decode()
    return json.dumps(data)


def job_as_pod(job: dict[str, Any]) -> dict[str, Any]:
    """A migration Job's pod template as a Pod that runs once (kube play ignores Jobs)."""
    template = copy.deepcopy(job["spec"]["template"])
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": job["metadata"]["name"], **template.get("metadata", {})},
        "spec": template["spec"],
    }


def translate_deployment(
    deployment: dict[str, Any], *, gateway_port: int | None, http_port: int
) -> dict[str, Any]:
    """The Deployment without containerPorts, or with only the gateway's published on 127.0.0.1."""
    translated = copy.deepcopy(deployment)
    for container in translated["spec"]["template"]["spec"]["containers"]:
        container.pop("ports", None)
        if gateway_port is not None:
            container["ports"] = [
                {"containerPort": http_port, "hostIP": "127.0.0.1", "hostPort": gateway_port}
            ]
    return translated


def service_aliases(objects: Sequence[dict[str, Any]], deployment: dict[str, Any]) -> list[str]:
    """The DNS names a cluster gives the Deployment's pods: every Service selecting them."""
    labels = deployment["spec"]["template"]["metadata"].get("labels", {})
    domain = "cluster.local"
    aliases = []
    for service in of_kind(objects, "Service"):
        selector = service["spec"].get("selector") or {}
        if selector and all(labels.get(k) == v for k, v in selector.items()):
            name = service["metadata"]["name"]
            aliases += [name, f"{name}.{NAMESPACE}", f"{name}.{NAMESPACE}.svc.{domain}"]
    return aliases


def played_pods(output: str) -> list[str]:
    """Pod IDs from `podman kube play` output ("Pod:\\n<id>\\n...")."""
    lines = output.splitlines()
    return [lines[i + 1].strip() for i, line in enumerate(lines[:-1]) if line.strip() == "Pod:"]


@dataclass
class PodStack:
    """One run's containers, pods, network and secret, all named after `run`."""

    engine: Engine
    root: Path
    run: str
    workdir: Path
    network: str = ""
    secrets: list[str] = field(default_factory=list)
    pods: dict[str, list[str]] = field(default_factory=dict)  # deployment -> pod names
    containers: list[str] = field(default_factory=list)
    gateway_port: int = 0

    def podman(self, *args: str, timeout: float = 600) -> str:
        return self.engine.output(*args, timeout=timeout)

    def create_network(self) -> None:
        self.network = f"{self.run}-net"
        self.podman("network", "create", self.network)

    def start_infra(self, image: str, values: dict[str, Any]) -> None:
        """PostgreSQL, Redis and NATS, reachable on the network by the names the values use."""
        database = urlsplit(values["database"]["url"])
        redis = urlsplit(values["redis"]["url"])
        nats = urlsplit(values["nats"]["url"])
        user, password = database.username or "crm", database.password or ""
        dbname = database.path.lstrip("/") or "crm"
        (self.workdir / "pgpass").write_text(password + "\n")
        postgres = (
            "set -e; D=/var/lib/postgresql/data; mkdir -p $D; "
            f"initdb -D $D -U {user} --pwfile=/run/pgpass --auth-host=scram-sha-256 "
            "--auth-local=trust >/dev/null; "
            "echo 'host all all all scram-sha-256' >> $D/pg_hba.conf; "
            f"echo 'CREATE DATABASE {dbname}' | postgres --single -D $D postgres >/dev/null; "
            "exec postgres -D $D -c listen_addresses='*' -c fsync=off -c max_connections=300 "
            "-c unix_socket_directories=/tmp"
        )
        servers = {
            "postgresql": (
                database.hostname,
                ["--user", "postgres", "-v", f"{self.workdir / 'pgpass'}:/run/pgpass:ro,Z"],
                ["sh", "-c", postgres],
            ),
            "redis": (
                redis.hostname,
                ["--user", "redis"],
                ["redis-server", "--bind", "0.0.0.0", "--protected-mode", "no", "--save", ""],
            ),
            "nats": (
                nats.hostname,
                ["--user", "nobody", "--tmpfs", "/data:rw,mode=1777"],
                ["nats-server", "-js", "-sd", "/data", "-p", str(nats.port or 4222)],
            ),
        }
        (self.workdir / "pgpass").chmod(0o644)
        for name, (alias, options, command) in servers.items():
            container = f"{self.run}-{name}"
            say(f"starting {name} ({container}, reachable as {alias})")
            self.podman(
                "run",
                "-d",
                "--name",
                container,
                "--network",
                self.network,
                "--network-alias",
                alias or name,
                *options,
                image,
                *command,
            )
            self.containers.append(container)
        self.wait_infra(user, dbname)

    def wait_infra(self, user: str, dbname: str) -> None:
        checks = {
            "postgresql": ["pg_isready", "-h", "127.0.0.1", "-U", user, "-d", dbname],
            "redis": ["redis-cli", "ping"],
        }
        deadline = time.monotonic() + 120
        for name, check in checks.items():
            while not self.engine.succeeds("exec", f"{self.run}-{name}", *check):
                if time.monotonic() > deadline:
                    raise EngineError(f"{name} did not start: {self.logs(f'{self.run}-{name}')}")
                time.sleep(1)

    def logs(self, container: str, tail: int = 40) -> str:
        result = subprocess.run(
            self.engine.argv("logs", "--tail", str(tail), container),
            env=self.engine.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=60,
        )
        return result.stdout[-3000:]

    def create_secrets(self, objects: Sequence[dict[str, Any]]) -> None:
        for secret in of_kind(objects, "Secret"):
            name = secret["metadata"]["name"]
            path = self.workdir / f"secret-{name}.json"
            path.write_text(secret_payload(secret))
            path.chmod(0o600)
            # kube play looks the Secret up by its manifest name: one run at a time per engine.
            if self.engine.succeeds("secret", "inspect", name):
                self.podman("secret", "rm", name)
            self.podman("secret", "create", name, str(path))
            self.secrets.append(name)

    def play(self, name: str, objects: Sequence[dict[str, Any]], *extra: str) -> list[str]:
        path = self.workdir / f"{name}.yaml"
        path.write_text(yaml.safe_dump_all(objects, sort_keys=False))
        output = self.podman("kube", "play", "--network", self.network, *extra, str(path))
        pods = played_pods(output)
        return [self.podman("pod", "inspect", "--format", "{{.Name}}", pod).strip() for pod in pods]

    def migrate(self, objects: Sequence[dict[str, Any]]) -> None:
        """The migration Jobs as Pods, side by side, each awaited; a failure stops the run."""
        jobs = of_kind(objects, "Job")
        pods = {job["metadata"]["name"]: self.play(job["metadata"]["name"], [job_as_pod(job)])
                for job in jobs}  # fmt: skip
        for job, names in pods.items():
            self.pods[job] = names
            for pod in names:
                for container in self.pod_containers(pod):
                    say(f"waiting for migration {job} ({container})")
                    code = self.podman("wait", container, timeout=MIGRATION_TIMEOUT).strip()
                    if code != "0":
                        raise EngineError(f"{job} exited with {code}: {self.logs(container)}")
        for job in list(pods):
            for pod in self.pods.pop(job):
                self.podman("pod", "rm", "-f", pod)

    def pod_containers(self, pod: str) -> list[str]:
        """The pod's containers other than its infra container."""
        found = json.loads(self.podman("pod", "inspect", pod))
        found = found[0] if isinstance(found, list) else found
        infra = found.get("InfraContainerID", "")
        return [c["Name"] for c in found.get("Containers", []) if c["Id"] != infra]

    def start_deployments(self, objects: Sequence[dict[str, Any]], http_port: int) -> None:
        self.gateway_port = free_port()
        for deployment in of_kind(objects, "Deployment"):
            name = deployment["metadata"]["name"]
            is_gateway = (
                deployment["spec"]["template"]["metadata"]["labels"].get(
                    "app.kubernetes.io/component"
                )
                == "gateway"
            )
            translated = translate_deployment(
                deployment,
                gateway_port=self.gateway_port if is_gateway else None,
                http_port=http_port,
            )
            self.pods[name] = self.play(name, [translated], "--start=false")
            aliases = service_aliases(objects, deployment)
            for pod in self.pods[name]:
                infra = self.podman("pod", "inspect", "--format", "{{.InfraContainerID}}", pod)
                self.podman("network", "disconnect", self.network, infra.strip())
                alias_options = [f"--alias={alias}" for alias in aliases]
                self.podman("network", "connect", *alias_options, self.network, infra.strip())
                say(f"starting pod {pod} (as {', '.join(aliases[:1])})")
                self.podman("pod", "start", pod)

    def state(self, manifests: Path) -> dict[str, Any]:
        return {
            "manifests": str(manifests),
            "network": self.network,
            "pods": self.pods,
            "infra": self.containers,
            "base_url": f"http://127.0.0.1:{self.gateway_port}",
            "containers_conf": self.engine.env.get("CONTAINERS_CONF", ""),
            "storage_conf": self.engine.env.get("CONTAINERS_STORAGE_CONF", ""),
        }

    def diagnose(self) -> None:
        say(self.engine.output("ps", "-a", check=False))
        for pods in self.pods.values():
            for pod in pods:
                for container in self.pod_containers(pod):
                    say(f"--- logs of {container}\n{self.logs(container)}")

    def teardown(self) -> None:
        """Remove what this run created, by name; each step is tried even if another fails."""
        for pods in self.pods.values():
            for pod in pods:
                self.engine.succeeds("pod", "rm", "-f", "-t", "2", pod)
        for container in self.containers:
            self.engine.succeeds("rm", "-f", "-v", "-t", "2", container)
        for secret in self.secrets:
            self.engine.succeeds("secret", "rm", secret)
        if self.network:
            self.engine.succeeds("network", "rm", "-f", self.network)
        say(f"removed the containers, pods, secret and network of {self.run}")


def run_pytest(root: Path, env: dict[str, str], pytest_args: Sequence[str]) -> tuple[int, str]:
    """pytest over SUITES, its output passed through; the exit code and its last line."""
    deselect = [f"--deselect={test}" for test in DESELECTED]
    command = [sys.executable, "-m", "pytest", *SUITES, "-q", *deselect, *pytest_args]
    say("$ " + " ".join(command))
    tail = ""
    with subprocess.Popen(command, cwd=root, env=env, stdout=subprocess.PIPE) as process:
        assert process.stdout is not None
        while chunk := os.read(process.stdout.fileno(), 4096):  # progress dots as they come
            sys.stdout.buffer.write(chunk)
            sys.stdout.flush()
            tail = (tail + chunk.decode(errors="replace"))[-4000:]
    lines = [line for line in tail.splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    return process.returncode, last


def container_test(root: Path, pytest_args: Sequence[str]) -> int:
    started = time.monotonic()
    # podman even where Docker answers: kube play and the inspection tests speak podman.
    engine = podman(root)
    values = scenario_values(root)
    tag = values["image"]["tag"]
    build_services(engine, root, ALL_SERVICES, tag)
    infra_image = build_infra(engine, root)
    say(f"images ready in {time.monotonic() - started:.0f}s")
    objects = render(root, values)
    http_port = int(values.get("ports", {}).get("http", 3000))
    workdir = Path(tempfile.mkdtemp(prefix="crm-container-test-"))
    manifests = workdir / "rendered.yaml"
    manifests.write_text(yaml.safe_dump_all(objects, sort_keys=False))
    stack = PodStack(engine, root, f"crm-ct-{os.getpid()}", workdir)
    summary = ""
    try:
        stack.create_network()
        stack.start_infra(infra_image, values)
        stack.create_secrets(objects)
        stack.migrate(objects)
        stack.start_deployments(objects, http_port)
        base_url = f"http://127.0.0.1:{stack.gateway_port}"
        wait_healthy(base_url, HEALTH_TIMEOUT)
        say(f"stack up from the chart's manifests in {time.monotonic() - started:.0f}s")
        state_file = workdir / "stack.json"
        state_file.write_text(json.dumps(stack.state(manifests), indent=2))
        env = dict(os.environ, CRM_BASE_URL=base_url, **{STATE_ENV: str(state_file)})
        say(f"running {' '.join(SUITES)} against {base_url}")
        code, summary = run_pytest(root, env, pytest_args)
        if code != 0:
            stack.diagnose()
        return code
    except EngineError:
        stack.diagnose()
        raise
    finally:
        stack.teardown()
        for path in sorted(workdir.glob("*"), reverse=True):
            path.unlink()
        workdir.rmdir()
        say(f"container-test took {time.monotonic() - started:.0f}s")
        if summary:
            say(summary)  # the run ends on pytest's summary line, which CI reads


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m crmstack.podstack", description=__doc__)
    parser.add_argument("pytest_args", nargs="*", help="passed on to pytest")
    args = parser.parse_args(argv)
    try:
        return container_test(Path.cwd(), args.pytest_args)
    except EngineError as exc:
        sys.stderr.write(f"make container-test: {exc}\n")
        return 2


if __name__ == "__main__":
    raise SystemExit(main())

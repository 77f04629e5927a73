"""The whole stack as child processes: infrastructure, migrations, every service, N replicas."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from crmstack.infra import InfraError, Infrastructure, start_infrastructure
from crmstack.ports import free_port, port_is_free, wait_for_port
from crmstack.processes import ManagedProcess, say

# gRPC services in start order; the gateway starts last.
GRPC_SERVICES = ("records", "metadata", "identity", "webhooks", "workflows")
GATEWAY = "gateway"
ALL_SERVICES = (*GRPC_SERVICES, GATEWAY)
MIGRATING_SERVICES = GRPC_SERVICES
PEER_RECONNECT_SECONDS = 1.5  # a peer channel's longest reconnect backoff, with jitter

_COLORS = {
    "records": 36,
    "metadata": 32,
    "identity": 33,
    "webhooks": 35,
    "workflows": 34,
    "gateway": 96,
    "postgres": 90,
    "redis": 90,
    "nats": 90,
}


class StackError(RuntimeError):
    """The stack could not start; the message says why."""


@dataclass
class StackConfig:
    data_dir: Path
    gateway_port: int | None = None  # None: a free port
    replicas: Mapping[str, int] = field(default_factory=dict)
    echo_logs: bool = False
    restart_on_failure: bool = False
    app_secret: str = ""
    extra_env: Mapping[str, str] = field(default_factory=dict)
    fast_postgres: bool = False
    startup_timeout: float = 90.0

    @staticmethod
    def replicas_from_env(environ: Mapping[str, str]) -> dict[str, int]:
        """REPLICAS_<service>=N for any service (e.g. REPLICAS_gateway=2)."""
        replicas: dict[str, int] = {}
        for service in ALL_SERVICES:
            value = environ.get(f"REPLICAS_{service}")
            if value is None:
                continue
            if not value.isdigit() or not 1 <= int(value) <= 16:
                raise StackError(
                    f"REPLICAS_{service} must be a whole number from 1 to 16, got {value!r}"
                )
            replicas[service] = int(value)
        return replicas


def persistent_app_secret(data_dir: Path) -> str:
    """APP_SECRET from the environment, else one generated once and kept in the data folder."""
    from_env = os.environ.get("APP_SECRET")
    if from_env:
        return from_env
    path = data_dir / "app_secret"
    if path.exists():
        return path.read_text().strip()
    data_dir.mkdir(parents=True, exist_ok=True)
    secret = secrets.token_urlsafe(48)
    path.write_text(secret)
    os.chmod(path, 0o600)
    return secret


@dataclass
class ServiceInstance:
    service: str
    replica: int
    process: ManagedProcess
    port: int  # gRPC port, or HTTP port for the gateway
    metrics_port: int


class Stack:
    """Start with start(), stop with stop(); everything started is stopped by PID."""

    def __init__(self, config: StackConfig) -> None:
        self.config = config
        self.logs = config.data_dir / "logs"
        self.infra: Infrastructure | None = None
        self.instances: dict[str, list[ServiceInstance]] = {}
        self.env: dict[str, str] = {}
        self._stopping = threading.Event()
        self._lock = threading.Lock()

    # -- addresses ---------------------------------------------------------------------------
    @property
    def gateway_urls(self) -> list[str]:
        return [f"http://127.0.0.1:{i.port}" for i in self.instances.get(GATEWAY, [])]

    @property
    def base_url(self) -> str:
        return self.gateway_urls[0]

    def grpc_address(self, service: str, replica: int = 0) -> str:
        return f"127.0.0.1:{self.instances[service][replica].port}"

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self.config.data_dir.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        try:
            self.infra = start_infrastructure(
                self.config.data_dir,
                self.logs,
                echo=self.config.echo_logs,
                fast_postgres=self.config.fast_postgres,
            )
        except InfraError as exc:
            raise StackError(str(exc)) from None
        try:
            self._plan()
            self._migrate()
            for service in GRPC_SERVICES:
                for instance in self.instances[service]:
                    self._launch(instance)
            for service in GRPC_SERVICES:
                for instance in self.instances[service]:
                    self._wait_listening(instance)
            for instance in self.instances[GATEWAY]:
                self._launch(instance)
            self.wait_healthy(self.config.startup_timeout)
            self._write_state()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        self._stopping.set()
        for service in (GATEWAY, *reversed(GRPC_SERVICES)):
            for instance in self.instances.get(service, []):
                instance.process.stop()
        if self.infra is not None:
            self.infra.stop()

    def _plan(self) -> None:
        assert self.infra is not None
        for service in ALL_SERVICES:
            count = self.config.replicas.get(service, 1)
            instances = []
            for replica in range(count):
                if service == GATEWAY and replica == 0 and self.config.gateway_port:
                    port = self.config.gateway_port
                    if not port_is_free(port):
                        raise StackError(f"port {port} is in use: stop what uses it or set PORT")
                else:
                    port = free_port()
                name = service if count == 1 else f"{service}-{replica + 1}"
                process = ManagedProcess(
                    name=name,
                    command=[sys.executable, "-m", service],
                    env={},
                    log_path=self.logs / f"{name}.log",
                    echo=self.config.echo_logs,
                    color=_COLORS.get(service, 0),
                )
                instances.append(ServiceInstance(service, replica, process, port, free_port()))
            self.instances[service] = instances
        self.env = self._shared_env()
        for instances in self.instances.values():
            for instance in instances:
                instance.process.env = self._process_env(instance)

    def _shared_env(self) -> dict[str, str]:
        assert self.infra is not None
        # The caller's environment passes through (`API_RATE_LIMITING_LIMIT=1000 make run`);
        # what the launcher decides (addresses, ports, the secret) and extra_env override it.
        env = dict(os.environ)
        env.update(
            {
                "APP_SECRET": self.config.app_secret,
                "CRM_ENV": "development",
                "DATABASE_URL": self.infra.database_url,
                "REDIS_URL": self.infra.redis_url,
                "NATS_URL": self.infra.nats_url,
                "SMTP_URL": self.infra.smtp_url,
                "PYTHONUNBUFFERED": "1",
                # Local runs send webhooks to local receivers (the chart keeps this off).
                "WEBHOOK_ALLOW_PRIVATE_TARGETS": "true",
            }
        )
        for service in GRPC_SERVICES:
            addresses = [f"127.0.0.1:{i.port}" for i in self.instances[service]]
            # Several replicas: gRPC balances over the listed addresses (round robin).
            env[f"{service.upper()}_ADDR"] = (
                addresses[0] if len(addresses) == 1 else "ipv4:" + ",".join(addresses)
            )
        env.update(self.config.extra_env)
        return env

    def _process_env(self, instance: ServiceInstance) -> dict[str, str]:
        env = dict(self.env)
        env["METRICS_PORT"] = str(instance.metrics_port)
        env["METRICS_HOST"] = "127.0.0.1"
        env["OTEL_SERVICE_NAME"] = instance.service
        if instance.service == GATEWAY:
            env["PORT"] = str(instance.port)
            env["HOST"] = "127.0.0.1"
        else:
            env["GRPC_PORT"] = str(instance.port)
            env["GRPC_HOST"] = "127.0.0.1"
        return env

    def _migrate(self) -> None:
        say("applying migrations")
        for service in MIGRATING_SERVICES:
            result = subprocess.run(
                [sys.executable, "-m", service, "migrate"],
                env=self._process_env(self.instances[service][0]),
                capture_output=True,
                text=True,
                timeout=120,
            )
            if result.returncode != 0:
                tail = (result.stderr or result.stdout).strip().splitlines()[-5:]
                raise StackError(f"migrations of {service} failed:\n" + "\n".join(tail))

    def _launch(self, instance: ServiceInstance) -> None:
        instance.process.start(on_exit=self._on_exit)

    def _wait_listening(self, instance: ServiceInstance) -> None:
        if not wait_for_port(instance.port, self.config.startup_timeout):
            raise StackError(
                f"{instance.process.name} did not start listening on {instance.port}:\n"
                + instance.process.tail()
            )

    def _on_exit(self, process: ManagedProcess, code: int) -> None:
        if self._stopping.is_set():
            return
        say(f"{process.name} exited with code {code}")
        if not self.config.restart_on_failure:
            return
        instance = self._instance_of(process)
        if instance is None:
            return

        def restart() -> None:
            if not self._stopping.is_set() and not instance.process.is_running():
                say(f"restarting {process.name}")
                self._launch(instance)

        threading.Timer(1.0, restart).start()

    def _instance_of(self, process: ManagedProcess) -> ServiceInstance | None:
        for instances in self.instances.values():
            for instance in instances:
                if instance.process is process:
                    return instance
        return None

    # -- health ------------------------------------------------------------------------------
    def health(self, url: str | None = None) -> tuple[int, dict[str, object]]:
        target = (url or self.base_url) + "/healthz"
        try:
            with urllib.request.urlopen(target, timeout=5) as response:
                return response.status, orjson.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, orjson.loads(exc.read() or b"{}")
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            return 0, {"error": str(exc)}

    def wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last: dict[str, object] = {}
        for url in self.gateway_urls:
            while True:
                status, last = self.health(url)
                if status == 200:
                    break
                for instances in self.instances.values():
                    for instance in instances:
                        if (
                            instance.process.popen is not None
                            and not instance.process.is_running()
                            and not self.config.restart_on_failure
                        ):
                            raise StackError(
                                f"{instance.process.name} exited during start:\n"
                                + instance.process.tail()
                            )
                if time.monotonic() > deadline:
                    raise StackError(f"stack not healthy after {timeout:.0f}s: {last}")
                time.sleep(0.2)

    # -- control, for tests ------------------------------------------------------------------
    def kill(self, service: str, replica: int = 0) -> None:
        """SIGKILL one service process, as a crash would."""
        self.instances[service][replica].process.kill()

    def terminate(self, service: str, replica: int = 0) -> None:
        """SIGTERM one service process and wait for its graceful exit."""
        self.instances[service][replica].process.stop()

    def restart(self, service: str, replica: int = 0) -> None:
        instance = self.instances[service][replica]
        if instance.process.is_running():
            instance.process.stop()
        self._launch(instance)
        self._wait_listening(instance)
        self.wait_healthy(self.config.startup_timeout)
        # The other services' channels to the old process are in reconnect backoff, capped at
        # 1 s plus jitter (crmkit.grpc_client); return once every peer can reach the new one.
        time.sleep(PEER_RECONNECT_SECONDS)

    def stop_infra(self, name: str) -> None:
        assert self.infra is not None
        self.infra.servers[name].stop()

    def start_infra(self, name: str) -> None:
        assert self.infra is not None
        self.infra.servers[name].start()

    def _write_state(self) -> None:
        assert self.infra is not None
        state = {
            "gatewayUrls": self.gateway_urls,
            "databaseUrl": self.infra.database_url,
            "redisUrl": self.infra.redis_url,
            "natsUrl": self.infra.nats_url,
            "services": {
                service: [
                    {
                        "name": i.process.name,
                        "pid": i.process.pid,
                        "port": i.port,
                        "metricsPort": i.metrics_port,
                    }
                    for i in instances
                ]
                for service, instances in self.instances.items()
            },
        }
        (self.config.data_dir / "stack.json").write_bytes(
            orjson.dumps(state, option=orjson.OPT_INDENT_2)
        )

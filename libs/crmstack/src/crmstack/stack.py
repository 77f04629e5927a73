"""The whole stack as child processes: infrastructure, migrations, every service, N replicas."""

from __future__ import annotations

import os
import secrets
import signal
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

from crmstack import local_sockets
from crmstack.backoff import RestartBackoff
from crmstack.infra import InfraError, Infrastructure, running_postmaster, start_infrastructure
from crmstack.ports import free_port, port_is_free, release_port, wait_for_port
from crmstack.processes import ManagedProcess, say, spawn, stop_together
from crmstack.state import (
    LauncherLock,
    Recorded,
    read_state,
    recorded_launcher,
    recorded_processes,
    remove_state,
    stop_recorded,
    write_state,
)

# gRPC services in start order; the gateway starts last.
GRPC_SERVICES = ("records", "metadata", "identity", "webhooks", "workflows")
GATEWAY = "gateway"
ALL_SERVICES = (*GRPC_SERVICES, GATEWAY)
MIGRATING_SERVICES = GRPC_SERVICES
_MIGRATION_TIMEOUT = 120.0  # seconds, for all services' migrations together
PEER_RECONNECT_SECONDS = 1.5  # a peer channel's longest reconnect backoff, with jitter
LOOPBACK = "127.0.0.1"

# What the launcher relaxes for local work: variable -> (its value here, the value a deployment
# keeps, what the relaxed value allows). tests/chart/test_guards.py checks the chart's defaults
# keep every one of them at its safe value.
RELAXED_SETTINGS: dict[str, tuple[str, str, str]] = {
    "CRM_ENV": ("development", "production", "GraphQL playground and /docs served"),
    "WEBHOOK_ALLOW_PRIVATE_TARGETS": (
        "true",
        "false",
        "webhooks and workflow actions may call loopback and private addresses",
    ),
}

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


# Starts of a service instance that dies before it listens (Stack._wait_listening).
_STARTS = 3


class StackError(RuntimeError):
    """The stack could not start; the message says why."""


@dataclass
class StackConfig:
    data_dir: Path
    gateway_port: int | None = None  # None: a free port
    gateway_host: str = LOOPBACK  # where the gateway listens (every other process: loopback)
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
            if not value.isdecimal() or not 1 <= int(value) <= 16:
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
    socket: Path | None = None  # a gRPC service's Unix socket beside its port (local_sockets)


def stop_command(data_dir: Path) -> str:
    """The command that stops the stack running from `data_dir`."""
    if data_dir == Path.cwd() / ".data":
        return "make stop"
    return f"python -m crmstack stop --data-dir {data_dir}"


class Stack:
    """Start with start(), stop with stop(); everything started is stopped by PID.

    With restart_on_failure, a service or embedded server that exits is restarted after a
    backoff; .data/stack.json names the launcher and the running PID of every process."""

    def __init__(self, config: StackConfig) -> None:
        self.config = config
        self.logs = config.data_dir / "logs"
        self.infra: Infrastructure | None = None
        self.instances: dict[str, list[ServiceInstance]] = {}
        self.env: dict[str, str] = {}
        self._stopping = threading.Event()
        self._lock = threading.RLock()
        self._claim = LauncherLock(config.data_dir)
        self._backoff = RestartBackoff()

    # -- addresses ---------------------------------------------------------------------------
    @property
    def gateway_urls(self) -> list[str]:
        host = self.config.gateway_host
        host = LOOPBACK if host in ("0.0.0.0", "") else host
        return [
            f"http://{host if i.replica == 0 else LOOPBACK}:{i.port}"
            for i in self.instances.get(GATEWAY, [])
        ]

    @property
    def base_url(self) -> str:
        return self.gateway_urls[0]

    def grpc_address(self, service: str, replica: int = 0) -> str:
        return f"127.0.0.1:{self.instances[service][replica].port}"

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self.config.data_dir.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        self.claim_data_dir()
        try:
            self.infra = start_infrastructure(
                self.config.data_dir,
                self.logs,
                echo=self.config.echo_logs,
                fast_postgres=self.config.fast_postgres,
                on_exit=self._on_exit if self.config.restart_on_failure else None,
            )
        except InfraError as exc:
            self._claim.release()
            raise StackError(str(exc)) from None
        except BaseException:
            self._claim.release()
            raise
        try:
            self._write_state()
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
        """Gateways, then every gRPC service together, then the servers together (each group
        SIGTERM, or SIGINT for PostgreSQL's fast shutdown; SIGKILL after its grace)."""
        with self._lock:
            self._stopping.set()
        stop_together((i.process for i in self.instances.get(GATEWAY, [])), grace=10)
        stop_together(
            (i.process for s in GRPC_SERVICES for i in self.instances.get(s, [])), grace=10
        )
        if self.infra is not None:
            self.infra.stop()
        for instances in self.instances.values():
            for instance in instances:
                release_port(instance.port)
                release_port(instance.metrics_port)
        if self._claim.held:  # never another launcher's file
            remove_state(self.config.data_dir)
            self._claim.release()

    def claim_data_dir(self) -> None:
        """Refuse while another launcher runs on this data folder; stop what a dead one left."""
        data_dir = self.config.data_dir
        if not self._claim.acquire():
            launcher = recorded_launcher(read_state(data_dir))
            pid = f" (launcher PID {launcher.pid})" if launcher else ""
            raise StackError(
                f"a CRM stack is already running from {data_dir}{pid}; "
                f"stop it with `{stop_command(data_dir)}`"
            )
        left = [p for p in recorded_processes(read_state(data_dir)) if p.is_running()]
        postmaster = running_postmaster(data_dir / "postgres")
        if postmaster is not None and postmaster not in {p.pid for p in left}:
            found = Recorded.of("postgres", postmaster, signal.SIGINT)
            left += [found] if found else []
        if left:
            names = ", ".join(f"{p.name} (PID {p.pid})" for p in left)
            say(f"stopping what an earlier launcher on {data_dir} left running: {names}")
            stop_recorded(left, grace=15)
        launcher = Recorded.of("launcher", os.getpid())
        # Until the servers run: enough for `make stop` to find this launcher.
        write_state(data_dir, {"launcher": launcher.as_json() if launcher else None})

    def _plan(self) -> None:
        assert self.infra is not None
        (self.config.data_dir / "sockets").mkdir(parents=True, exist_ok=True)
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
                socket = None
                if service != GATEWAY:
                    socket = local_sockets.grpc_socket(self.config.data_dir, name)
                instances.append(
                    ServiceInstance(service, replica, process, port, free_port(), socket)
                )
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
        env.update({name: relaxed for name, (relaxed, _, _) in RELAXED_SETTINGS.items()})
        env.update(
            {
                "APP_SECRET": self.config.app_secret,
                "DATABASE_URL": self.infra.service_database_url,
                "REDIS_URL": self.infra.redis_url,
                "NATS_URL": self.infra.nats_url,
                "SMTP_URL": self.infra.smtp_url,
                "PYTHONUNBUFFERED": "1",
            }
        )
        for service in GRPC_SERVICES:
            instances = self.instances[service]
            addresses = [f"127.0.0.1:{i.port}" for i in instances]
            if len(instances) == 1:
                socket = instances[0].socket
                env[f"{service.upper()}_ADDR"] = f"unix:{socket}" if socket else addresses[0]
            else:
                # Several replicas: gRPC balances over the listed addresses (round robin).
                env[f"{service.upper()}_ADDR"] = "ipv4:" + ",".join(addresses)
        env.update(self.config.extra_env)
        return env

    def _process_env(self, instance: ServiceInstance) -> dict[str, str]:
        env = dict(self.env)
        env["METRICS_PORT"] = str(instance.metrics_port)
        env["METRICS_HOST"] = "127.0.0.1"
        env["OTEL_SERVICE_NAME"] = instance.service
        if instance.service == GATEWAY:
            env["PORT"] = str(instance.port)
            env["HOST"] = self.config.gateway_host if instance.replica == 0 else LOOPBACK
        else:
            env["GRPC_PORT"] = str(instance.port)
            env["GRPC_HOST"] = "127.0.0.1"
            if instance.socket is not None:
                env["GRPC_UNIX_SOCKET"] = str(instance.socket)
        return env

    def relaxed_settings(self) -> str:
        """One line naming every safety setting this stack relaxes (for `make run`)."""
        relaxed = [
            f"{name}={self.env[name]} ({allows})"
            for name, (_, safe, allows) in RELAXED_SETTINGS.items()
            if self.env.get(name, safe).lower() != safe
        ]
        assert self.infra is not None
        embedded = [name for name in ("postgres", "redis", "nats") if name in self.infra.servers]
        if embedded:
            relaxed.append(f"{', '.join(embedded)} without passwords on {LOOPBACK}")
        host = self.config.gateway_host
        if host != LOOPBACK:
            relaxed.append(f"gateway listening on {host or 'every address'} (HOST)")
        return "relaxed for local work, never in a deployment: " + "; ".join(relaxed)

    def _migrate(self) -> None:
        """Every service's migrations at once: each owns its schema (and its own advisory lock,
        `crmkit.db.migrate`), as when the chart's pods start together; most of each run is
        Python starting, which two cores do two at a time."""
        say("applying migrations")
        running = {
            service: spawn(
                [sys.executable, "-m", service, "migrate"],
                env=self._process_env(self.instances[service][0]),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            for service in MIGRATING_SERVICES
        }
        deadline = time.monotonic() + _MIGRATION_TIMEOUT
        failures: list[str] = []
        try:
            for service, migrate in running.items():
                try:
                    output, errors = migrate.communicate(
                        timeout=max(0.0, deadline - time.monotonic())
                    )
                except subprocess.TimeoutExpired:
                    raise StackError(
                        f"migrations of {service} took over {_MIGRATION_TIMEOUT:.0f} s"
                    ) from None
                if migrate.returncode != 0:
                    tail = (errors or output).decode(errors="replace").strip().splitlines()[-5:]
                    failures.append(f"migrations of {service} failed:\n" + "\n".join(tail))
        finally:
            for migrate in running.values():
                if migrate.poll() is None:
                    migrate.kill()
                    migrate.wait()
        if failures:
            raise StackError("\n".join(failures))

    def _launch(self, instance: ServiceInstance) -> None:
        with self._lock:
            instance.process.start(on_exit=self._on_exit)
            self._write_state()

    def _wait_listening(self, instance: ServiceInstance) -> None:
        """Until the instance listens. A child that died before it listened is started again,
        twice at most: a child forked from a process that uses gRPC can crash before its exec
        (gRPC's fork handlers, grpc/grpc#43055), which no restart policy should need to cover."""
        deadline = time.monotonic() + self.config.startup_timeout
        starts = 1
        while not wait_for_port(instance.port, 0.5):
            process = instance.process
            if time.monotonic() > deadline or (starts >= _STARTS and not process.is_running()):
                raise StackError(
                    f"{process.name} did not start listening on {instance.port}:\n" + process.tail()
                )
            if not process.is_running() and self._start_exited(process):
                starts += 1
                say(f"{process.name} exited before it listened; starting it again")

    def _start_exited(self, process: ManagedProcess) -> bool:
        with self._lock:
            if self._stopping.is_set() or process.is_running():
                return False
            process.start(on_exit=self._on_exit)
            self._write_state()
            return True

    def _on_exit(self, process: ManagedProcess, code: int) -> None:
        if self._stopping.is_set():
            return
        if not self.config.restart_on_failure:
            say(f"{process.name} exited with code {code}")
            return
        delay = self._backoff.delay(process.name, process.started_at)
        say(f"{process.name} exited with code {code}; restarting it in {delay:.1f} s")
        timer = threading.Timer(delay, self._restart, (process,))
        timer.daemon = True
        timer.start()

    def _restart(self, process: ManagedProcess) -> None:
        # PostgreSQL recovers from its WAL as it starts; NATS reloads its JetStream store.
        self._start_exited(process)

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
        """stack.json: the launcher, every running process (PID and start time) and the
        addresses; rewritten on every (re)start of a process."""
        with self._lock:  # built and written as one step: never an older list over a newer
            assert self.infra is not None
            launcher = Recorded.of("launcher", os.getpid())
            processes = [
                Recorded.of(p.name, p.pid, p.stop_signal)
                for p in self._all_processes()
                if p.pid is not None and p.is_running()
            ]
            state = {
                "launcher": launcher.as_json() if launcher else None,
                "stopCommand": stop_command(self.config.data_dir),
                "processes": [p.as_json() for p in processes if p is not None],
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
            write_state(self.config.data_dir, state)

    def _all_processes(self) -> list[ManagedProcess]:
        """Services first, then the servers (the order `stop` falls back on)."""
        services = [i.process for s in (GATEWAY, *GRPC_SERVICES) for i in self.instances.get(s, [])]
        servers = [s.process for s in self.infra.servers.values()] if self.infra else []
        return services + servers

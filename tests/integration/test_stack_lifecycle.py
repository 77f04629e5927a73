"""The launcher behind `make run`, run as a user runs it: `python -m crmstack run` in a
subprocess, on its own data folder and port, stopped by PID at the end of each test.

One stack runs for the module (crashes of its servers and services, a second launcher on its
data); the SIGKILL test starts and stops another on a second data folder, twice.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from crmstack.client import Session, signup
from crmstack.ports import free_port
from crmstack.state import Recorded, read_state, recorded_launcher, recorded_processes

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("CRM_BASE_URL")),
    reason="needs the local launcher: these tests start and kill their own stacks",
)

START_TIMEOUT = 180.0  # a first start runs initdb and every migration on a shared machine
RECOVERY_TIMEOUT = 15.0  # issue 25: a healthy stack within 15 s of a server's crash
LAUNCHER_EXIT_TIMEOUT = 10.0  # issue 25: nothing left 10 s after the launcher's SIGKILL
# What would make the launcher use other servers or another secret than its data folder's.
NOT_INHERITED = ("DATABASE_URL", "REDIS_URL", "NATS_URL", "SMTP_URL", "APP_SECRET", "HOST")

T = TypeVar("T")


def wait_for(what: str, check: Callable[[], T | None], timeout: float) -> T:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(httpx.HTTPError):
            result = check()
            if result:
                return result
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.2)


class Launcher:
    """`python -m crmstack run --data-dir <folder>` with PORT=<port>, output to a file."""

    def __init__(self, data_dir: Path, port: int) -> None:
        self.data_dir = data_dir
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.output = data_dir.parent / f"{data_dir.name}-launcher.out"
        self.popen: subprocess.Popen[bytes] | None = None
        self.seen: set[Recorded] = set()  # every process it ever named, stopped at close()

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if k not in NOT_INHERITED}
        env["PORT"] = str(self.port)
        with open(self.output, "ab") as output:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "crmstack", "run", "--data-dir", str(self.data_dir)],
                env=env,
                stdout=output,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def text(self) -> str:
        return self.output.read_text(errors="replace") if self.output.exists() else ""

    def healthy(self) -> bool:
        return httpx.get(self.url + "/healthz", timeout=5).status_code == 200

    def wait_healthy(self, timeout: float = START_TIMEOUT) -> None:
        def ready() -> bool:
            assert self.popen is not None
            if self.popen.poll() is not None:
                raise AssertionError(f"launcher exited:\n{self.text()[-3000:]}")
            return "CRM stack is healthy" in self.text() and self.healthy()

        wait_for("the launcher's stack healthy", ready, timeout)
        self.processes()

    def processes(self) -> dict[str, Recorded]:
        """What stack.json names now, launcher included."""
        state = read_state(self.data_dir)
        named = {p.name: p for p in recorded_processes(state)}
        launcher = recorded_launcher(state)
        if launcher is not None:
            named["launcher"] = launcher
        self.seen.update(named.values())
        return named

    def close(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(60)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)
        for process in self.seen:
            if process.is_running():
                os.kill(process.pid, signal.SIGKILL)


@contextlib.contextmanager
def launcher_on(prefix: str) -> Iterator[Launcher]:
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    launcher = Launcher(folder / "data", free_port())
    try:
        yield launcher
    finally:
        launcher.close()
        if os.environ.get("CRM_KEEP_TEST_DATA") != "1":
            shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def running() -> Iterator[Launcher]:
    with launcher_on("crm-it-launcher-") as launcher:
        launcher.start()
        launcher.wait_healthy()
        yield launcher


@pytest.fixture(scope="module")
def http(running: Launcher) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=running.url, timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def session(http: httpx.Client) -> Session:
    return signup(http)


def try_create_person(http: httpx.Client, session: Session, name: str) -> dict[str, Any] | None:
    response = http.post("/rest/people", json={"firstName": name}, headers=session.headers)
    if response.status_code != 201:
        return None
    person: dict[str, Any] = response.json()["data"]
    return person


def create_person(http: httpx.Client, session: Session, name: str) -> dict[str, Any]:
    person = try_create_person(http, session, name)
    assert person is not None
    return person


def first_name_of(http: httpx.Client, session: Session, person_id: str) -> str | None:
    response = http.get(f"/rest/people/{person_id}", headers=session.headers)
    return str(response.json()["data"]["firstName"]) if response.status_code == 200 else None


def listening_addresses(port: int) -> set[str]:
    """Local addresses (hex, as in /proc/net/tcp*) of the sockets listening on `port`."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, local_port = local.split(":")
            if state == "0A" and int(local_port, 16) == port:
                found.add(address)
    return found


def test_make_run_names_what_it_relaxes_listens_on_loopback_and_says_how_to_stop(
    running: Launcher,
) -> None:
    output = running.text()
    relaxed = [line for line in output.splitlines() if line.startswith("relaxed for local work")]
    assert len(relaxed) == 1, output[-3000:]
    assert "CRM_ENV=development" in relaxed[0]
    assert "WEBHOOK_ALLOW_PRIVATE_TARGETS=true" in relaxed[0]
    assert f"python -m crmstack stop --data-dir {running.data_dir}" in output
    assert listening_addresses(running.port) == {"0100007F"}  # 127.0.0.1 only


def test_a_second_launcher_on_the_same_data_refuses_with_the_stop_command(
    running: Launcher,
) -> None:
    before = running.processes()
    env = {k: v for k, v in os.environ.items() if k not in NOT_INHERITED}
    second = subprocess.run(
        [sys.executable, "-m", "crmstack", "run", "--data-dir", str(running.data_dir)],
        env={**env, "PORT": str(free_port())},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert second.returncode == 1
    assert "already running" in second.stderr
    assert f"launcher PID {before['launcher'].pid}" in second.stderr
    assert f"python -m crmstack stop --data-dir {running.data_dir}" in second.stderr
    assert running.healthy()
    assert running.processes() == before


@pytest.mark.parametrize("server", ["postgres", "nats", "redis"])
def test_a_killed_server_is_restarted_with_acknowledged_writes_kept(
    running: Launcher, http: httpx.Client, session: Session, server: str
) -> None:
    person = create_person(http, session, f"before-{server}")
    old = running.processes()[server]
    os.kill(old.pid, signal.SIGKILL)

    def recovered() -> Recorded | None:
        new = running.processes().get(server)
        if new is None or new.pid == old.pid or not new.is_running() or not running.healthy():
            return None
        return new if try_create_person(http, session, f"after-{server}") else None

    new = wait_for(f"{server} restarted and the stack healthy", recovered, RECOVERY_TIMEOUT)
    assert first_name_of(http, session, person["id"]) == f"before-{server}"
    assert re.search(rf"^{server} exited with code -9; restarting it in", running.text(), re.M)
    assert not old.is_running()
    assert new.is_running()


def test_a_killed_service_is_restarted_and_stack_json_names_its_new_pid(
    running: Launcher, http: httpx.Client, session: Session
) -> None:
    old = running.processes()["records"]
    os.kill(old.pid, signal.SIGKILL)

    def restarted() -> Recorded | None:
        new = running.processes()["records"]
        return new if new.pid != old.pid and new.is_running() and running.healthy() else None

    wait_for("records restarted", restarted, RECOVERY_TIMEOUT)
    wait_for("a write through the new records", lambda: try_create_person(http, session, "r"), 30)


def test_sigkill_of_the_launcher_leaves_nothing_the_next_run_keeps_the_data_and_stop_stops_it(
    running: Launcher,
) -> None:
    others = running.processes()
    with launcher_on("crm-it-launcher-killed-") as launcher:
        launcher.start()
        launcher.wait_healthy()
        with httpx.Client(base_url=launcher.url, timeout=30) as http:
            session = signup(http)
            person = create_person(http, session, "kept")
        first = launcher.processes()
        assert {"launcher", "gateway", "records", "postgres", "redis", "nats"} <= set(first)

        assert launcher.popen is not None
        launcher.popen.kill()
        launcher.popen.wait(10)
        wait_for(
            "every process of the killed launcher gone",
            lambda: not [p for p in first.values() if p.is_running()],
            LAUNCHER_EXIT_TIMEOUT,
        )
        # A PostgreSQL lock file naming a PID that now belongs to another process (a PID reused
        # after a crash): PostgreSQL alone refuses to start on it.
        lock = launcher.data_dir / "postgres" / "postmaster.pid"
        lock.write_text(f"{os.getpid()}\n{launcher.data_dir / 'postgres'}\n")

        launcher.start()
        launcher.wait_healthy()
        with httpx.Client(base_url=launcher.url, timeout=30) as http:
            assert first_name_of(http, session, person["id"]) == "kept"
        second = launcher.processes()
        assert not {p.pid for p in second.values()} & {p.pid for p in first.values()}
        assert running.processes() == others  # the other stack was not touched
        assert running.healthy()

        stop = subprocess.run(
            [sys.executable, "-m", "crmstack", "stop", "--data-dir", str(launcher.data_dir)],
            capture_output=True,
            text=True,
            timeout=90,
        )
        assert stop.returncode == 0, stop.stderr
        stopped = stop.stdout.splitlines()[-1]
        assert stopped.startswith("stopped: ")
        for name in ("launcher", "gateway", "postgres", "nats"):
            assert f"{name} (PID {second[name].pid})" in stopped
        assert launcher.popen.wait(30) == 0
        assert not [p for p in second.values() if p.is_running()]
        assert running.processes() == others
        assert running.healthy()

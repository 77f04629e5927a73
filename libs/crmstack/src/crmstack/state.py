"""What a running stack leaves in its data folder: a lock held by the launcher and stack.json.

The lock (`launcher.lock`, an exclusive flock) is held for the launcher's whole life and released
by the kernel however it ends, so "is a launcher running on this folder" never depends on a PID
file being cleaned up. stack.json names every process with its PID and the kernel's start time
of that PID, so a PID reused by an unrelated process is never taken for one of ours.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

STATE_FILE = "stack.json"
LOCK_FILE = "launcher.lock"


def start_time(pid: int) -> int | None:
    """The kernel's start time of `pid` (clock ticks since boot), None when it does not run."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # Field 2 (the command) may hold spaces and parentheses: split after its closing one.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":  # a zombie has exited
        return None
    return int(fields[19])


@dataclass(frozen=True)
class Recorded:
    """One process named in stack.json."""

    name: str
    pid: int
    started: int
    stop_signal: int = signal.SIGTERM

    def is_running(self) -> bool:
        return start_time(self.pid) == self.started

    def wait_gone(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.is_running():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "pid": self.pid,
            "started": self.started,
            "stopSignal": self.stop_signal,
        }

    @staticmethod
    def of(name: str, pid: int, stop_signal: int = signal.SIGTERM) -> Recorded | None:
        started = start_time(pid)
        return None if started is None else Recorded(name, pid, started, stop_signal)


def read_state(data_dir: Path) -> dict[str, Any]:
    try:
        state = orjson.loads((data_dir / STATE_FILE).read_bytes())
    except (FileNotFoundError, orjson.JSONDecodeError):
        return {}
    return state if isinstance(state, dict) else {}


def write_state(data_dir: Path, state: dict[str, Any]) -> None:
    """Replace stack.json in one step (a reader never sees half a file)."""
    path = data_dir / STATE_FILE
    partial = path.with_suffix(".json.tmp")
    partial.write_bytes(orjson.dumps(state, option=orjson.OPT_INDENT_2))
    partial.replace(path)


def remove_state(data_dir: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        (data_dir / STATE_FILE).unlink()


def recorded_processes(state: dict[str, Any]) -> list[Recorded]:
    """Every process stack.json names (launcher excluded), infrastructure last."""
    found = []
    for entry in state.get("processes", []):
        try:
            found.append(
                Recorded(
                    str(entry["name"]),
                    int(entry["pid"]),
                    int(entry["started"]),
                    int(entry.get("stopSignal", signal.SIGTERM)),
                )
            )
        except (KeyError, TypeError, ValueError):
            continue
    return found


def recorded_launcher(state: dict[str, Any]) -> Recorded | None:
    entry = state.get("launcher")
    if not isinstance(entry, dict):
        return None
    try:
        return Recorded("launcher", int(entry["pid"]), int(entry["started"]))
    except (KeyError, TypeError, ValueError):
        return None


class LauncherLock:
    """The exclusive lock a launcher holds on its data folder while it runs."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / LOCK_FILE
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> bool:
        """True when taken; False when another launcher holds it. Not inherited by children."""
        if self._fd is not None:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def wait(self, timeout: float) -> bool:
        """Acquire, retrying until `timeout` seconds have passed."""
        deadline = time.monotonic() + timeout
        while not self.acquire():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True


def stop_recorded(processes: list[Recorded], grace: float) -> list[Recorded]:
    """Stop the ones still running (their stop signal, SIGKILL after `grace`); return them."""
    running = [p for p in processes if p.is_running()]
    for process in running:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(process.pid, process.stop_signal)
    deadline = time.monotonic() + grace
    while any(p.is_running() for p in running) and time.monotonic() < deadline:
        time.sleep(0.1)
    for process in running:
        if process.is_running():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(process.pid, signal.SIGKILL)
    return running

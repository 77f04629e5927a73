"""Child processes with prefixed logs, stopped by PID (SIGTERM, then SIGKILL after a grace)."""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TypedDict

import orjson

_COLORS = (36, 32, 33, 35, 34, 31, 96, 92, 93, 95, 94)


def render_line(raw: str) -> str:
    """A JSON log line as `time level message key=value ...`; other lines unchanged."""
    if not raw.startswith("{"):
        return raw
    try:
        entry = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw
    if not isinstance(entry, dict) or "message" not in entry:
        return raw
    time_part = str(entry.pop("time", ""))[11:23]
    level = str(entry.pop("level", "")).upper()
    message = entry.pop("message")
    for key in ("service", "logger", "span_id", "color_message"):
        entry.pop(key, None)
    exception = entry.pop("exception", None)
    extras = " ".join(f"{key}={value}" for key, value in entry.items())
    line = f"{time_part} {level:<7} {message}" + (f"  {extras}" if extras else "")
    if exception:
        line += "\n" + str(exception)
    return line


@dataclass
class ManagedProcess:
    """One child process: its command, environment and where its output goes."""

    name: str
    command: Sequence[str]
    env: Mapping[str, str]
    log_path: Path
    echo: bool = False
    color: int = 0
    cwd: Path | None = None
    user: str | None = None
    stop_signal: int = signal.SIGTERM
    popen: subprocess.Popen[bytes] | None = field(default=None, init=False)
    _pump: threading.Thread | None = field(default=None, init=False)
    _on_exit: Callable[[ManagedProcess, int], None] | None = field(default=None, init=False)

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None

    def start(self, on_exit: Callable[[ManagedProcess, int], None] | None = None) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._on_exit = on_exit
        self.popen = subprocess.Popen(
            list(self.command),
            env=dict(self.env),
            cwd=self.cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C reaches the launcher, which stops children in order
            **drop_privileges(self.user),
        )
        self._pump = threading.Thread(
            target=self._pump_output, name=f"log-{self.name}", daemon=True
        )
        self._pump.start()

    def _pump_output(self) -> None:
        popen = self.popen
        assert popen is not None
        assert popen.stdout is not None
        prefix = (
            f"\x1b[{self.color}m{self.name:<12}|\x1b[0m "
            if sys.stdout.isatty()
            else (f"{self.name:<12}| ")
        )
        with open(self.log_path, "ab") as log_file:
            for raw in iter(popen.stdout.readline, b""):
                log_file.write(raw)
                log_file.flush()
                if self.echo:
                    text = raw.decode(errors="replace").rstrip("\n")
                    _write(sys.stdout, prefix + render_line(text) + "\n")
        code = popen.wait()
        if self._on_exit is not None:
            self._on_exit(self, code)

    def is_running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def send(self, sig: int) -> None:
        if self.is_running():
            assert self.popen is not None
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.popen.pid, sig)

    def stop(self, grace: float = 10.0) -> int | None:
        """Its stop signal, wait up to `grace` seconds, then SIGKILL. Returns the exit code."""
        if self.popen is None:
            return None
        self._on_exit = None
        if self.is_running():
            self.send(self.stop_signal)
            try:
                self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                self.send(signal.SIGKILL)
                self.popen.wait(5)
        if self._pump is not None:
            self._pump.join(timeout=5)
        return self.popen.returncode

    def kill(self) -> None:
        """SIGKILL now, as a crash would."""
        if self.popen is None:
            return
        self._on_exit = None
        self.send(signal.SIGKILL)
        self.popen.wait(5)
        if self._pump is not None:
            self._pump.join(timeout=5)

    def tail(self, lines: int = 40) -> str:
        try:
            content = self.log_path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return ""
        return "\n".join(render_line(line) for line in content[-lines:])


class PrivilegeArgs(TypedDict, total=False):
    user: int
    group: int
    extra_groups: list[int]


def drop_privileges(user: str | None) -> PrivilegeArgs:
    """Popen arguments that run a child as `user` with only that user's own group."""
    if user is None:
        return {}
    account = pwd.getpwnam(user)
    return {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}


_write_lock = threading.Lock()


def _write(stream: IO[str], text: str) -> None:
    with _write_lock:
        stream.write(text)
        stream.flush()


def say(text: str) -> None:
    """A launcher message, interleaved safely with the children's output."""
    _write(sys.stdout, text + "\n")

"""Child processes with prefixed logs, stopped by PID (SIGTERM, then SIGKILL after a grace).

Every child is forked by one long-lived thread and asks the kernel for a signal when that thread
dies (PR_SET_PDEATHSIG), so nothing the launcher started outlives it, however it ends.

The signal is armed by `setpriv --pdeathsig` (util-linux) between the fork and the command's exec,
not by a Python `preexec_fn`: forking a process whose gRPC and other threads are running and then
running Python in the child is not fork-safe (a restarted NATS once never reached its exec).
Without a `preexec_fn`, `subprocess` uses vfork and the child runs no Python and no fork handlers.
Where setpriv is missing, the `preexec_fn` is the fallback.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import pwd
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypedDict

import orjson

_COLORS = (36, 32, 33, 35, 34, 31, 96, 92, 93, 95, 94)
_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
# The parent-death signal fires when the *thread* that forked the child ends, not the process:
# a restart from a timer thread would otherwise kill its child as soon as the timer returns. One
# thread that lives as long as the launcher forks every child.
_spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="crmstack-spawner")
_SETPRIV = shutil.which("setpriv", path="/usr/bin:/bin:/usr/sbin:/sbin")


def _die_with_parent(sig: int, parent: int) -> Callable[[], None]:
    """A preexec_fn: `sig` when the launcher dies; exit now if it died before this ran."""

    def arm() -> None:
        _libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return arm


def spawn(
    command: Sequence[str], *, death_signal: int = signal.SIGKILL, **kwargs: Any
) -> subprocess.Popen[bytes]:
    """Popen from the spawner thread; the child gets `death_signal` when the launcher dies.

    It runs in its own session, so a Ctrl-C in the terminal reaches only the launcher, which
    stops the children in order."""
    # Armed after any change of user (a credential change clears the parent-death signal):
    # Popen changes the user before the exec, setpriv arms the signal after it.
    argv, arm = with_death_signal(command, death_signal, _SETPRIV)

    def fork() -> subprocess.Popen[bytes]:
        return subprocess.Popen(argv, start_new_session=True, preexec_fn=arm, **kwargs)

    return _spawner.submit(fork).result()


def with_death_signal(
    command: Sequence[str], death_signal: int, setpriv: str | None
) -> tuple[list[str], Callable[[], None] | None]:
    """The argv and preexec_fn that give `command` `death_signal` when the launcher dies
    (`setpriv`: its path, or None for the preexec_fn).

    With setpriv the window between the fork and setpriv's prctl is not covered: a launcher
    killed inside it leaves that one child running (the preexec_fn checks the parent's PID)."""
    if setpriv is not None:
        signal_name = signal.Signals(death_signal).name
        return [setpriv, f"--pdeathsig={signal_name}", "--", *command], None
    return list(command), _die_with_parent(death_signal, os.getpid())


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
    death_signal: int = signal.SIGKILL  # sent by the kernel when the launcher dies
    started_at: float = field(default=0.0, init=False)  # time.monotonic() of the last start
    popen: subprocess.Popen[bytes] | None = field(default=None, init=False)
    _pump: threading.Thread | None = field(default=None, init=False)
    _on_exit: Callable[[ManagedProcess, int], None] | None = field(default=None, init=False)

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None

    def start(self, on_exit: Callable[[ManagedProcess, int], None] | None = None) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._on_exit = on_exit
        self.started_at = time.monotonic()
        self.popen = spawn(
            self.command,
            death_signal=self.death_signal,
            env=dict(self.env),
            cwd=self.cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
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
        self.begin_stop()
        return self.finish_stop(time.monotonic() + grace)

    def begin_stop(self) -> None:
        """Send the stop signal without waiting (no restart follows this exit)."""
        self._on_exit = None
        self.send(self.stop_signal)

    def finish_stop(self, deadline: float) -> int | None:
        """Wait for the exit until `deadline` (time.monotonic()), then SIGKILL."""
        if self.popen is None:
            return None
        try:
            self.popen.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            say(f"{self.name} (PID {self.popen.pid}) did not stop in time: killed")
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


def stop_together(processes: Iterable[ManagedProcess], grace: float) -> None:
    """Stop signal to all at once, then wait for all within one `grace` (SIGKILL after it)."""
    group = list(processes)
    for process in group:
        process.begin_stop()
    deadline = time.monotonic() + grace
    for process in group:
        process.finish_stop(deadline)


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
    # A closed terminal (SIGHUP, then EIO) must not stop the launcher from stopping its children.
    with _write_lock, contextlib.suppress(OSError, ValueError):
        stream.write(text)
        stream.flush()


def say(text: str) -> None:
    """A launcher message, interleaved safely with the children's output."""
    _write(sys.stdout, text + "\n")

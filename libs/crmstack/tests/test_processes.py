"""A child started by `spawn` dies with its launcher, on the setpriv path and the fallback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from crmstack.processes import with_death_signal

LAUNCHER = """
import subprocess, sys, threading, time
from crmstack import processes
if sys.argv[1] == "fallback":
    processes._SETPRIV = None
# Threads running while the launcher forks, as gRPC's poller threads are in a service.
for _ in range(4):
    threading.Thread(target=lambda: [time.sleep(0.0005) for _ in iter(int, 1)], daemon=True).start()
children = [processes.spawn(["sleep", "60"], stdout=subprocess.DEVNULL) for _ in range(20)]
print(" ".join(str(child.pid) for child in children), flush=True)
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.mark.parametrize("path", ["setpriv", "fallback"])
def test_children_started_among_running_threads_exec_and_die_with_the_launcher(path: str) -> None:
    if path == "setpriv" and not Path("/usr/bin/setpriv").exists():
        pytest.skip("setpriv (util-linux) is not installed on this machine")
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, path], stdout=subprocess.PIPE, text=True
    )
    try:
        assert launcher.stdout is not None
        pids = [int(pid) for pid in launcher.stdout.readline().split()]
        assert len(pids) == 20
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            commands = {Path(f"/proc/{pid}/cmdline").read_bytes() for pid in pids}
            if commands == {b"sleep\x0060\x00"}:
                break
            time.sleep(0.05)
        assert commands == {b"sleep\x0060\x00"}, "every child reached the exec of its command"
    finally:
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait(5)
    deadline = time.monotonic() + 5
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [pid for pid in pids if _alive(pid)] == []


def test_setpriv_wraps_the_command_and_no_python_runs_in_the_child() -> None:
    argv, preexec = with_death_signal(["nats-server", "-js"], signal.SIGTERM, "/usr/bin/setpriv")
    assert argv == ["/usr/bin/setpriv", "--pdeathsig=SIGTERM", "--", "nats-server", "-js"]
    assert preexec is None
    argv, preexec = with_death_signal(["nats-server", "-js"], signal.SIGTERM, None)
    assert argv == ["nats-server", "-js"]
    assert preexec is not None

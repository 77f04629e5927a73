"""`python -m crmstack run`: the whole stack in the foreground until Ctrl-C or SIGTERM.
`python -m crmstack stop`: stop the stack running from a data folder (`make stop`)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from crmstack.processes import say
from crmstack.stack import LOOPBACK, Stack, StackConfig, StackError, persistent_app_secret
from crmstack.stack import stop_command as stop_command_for
from crmstack.state import (
    LauncherLock,
    Recorded,
    read_state,
    recorded_launcher,
    recorded_processes,
    stop_recorded,
)

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # SIGHUP: the terminal closed


def run(data_dir: Path) -> int:
    port_text = os.environ.get("PORT", "3000")
    if not port_text.isdecimal():
        sys.stderr.write(f"configuration error: PORT must be a port number, got {port_text!r}\n")
        return 2
    try:
        config = StackConfig(
            data_dir=data_dir,
            gateway_port=int(port_text),
            gateway_host=os.environ.get("HOST", LOOPBACK),
            replicas=StackConfig.replicas_from_env(os.environ),
            echo_logs=True,
            restart_on_failure=True,
            app_secret=persistent_app_secret(data_dir),
        )
    except StackError as exc:
        sys.stderr.write(f"configuration error: {exc}\n")
        return 2
    if len(config.app_secret) < 16:
        sys.stderr.write("configuration error: APP_SECRET must be at least 16 characters\n")
        return 2
    stop = threading.Event()
    started = threading.Event()

    def on_signal(signum: int, _: FrameType | None) -> None:
        if stop.is_set():
            # A second Ctrl-C: leave now; the kernel sends every child its parent-death signal
            # (PostgreSQL a fast shutdown, the rest SIGKILL).
            say("stopping at once")
            os._exit(128 + signum)
        stop.set()
        if not started.is_set():
            raise KeyboardInterrupt  # abandons the start, which stops what it started

    for sig in STOP_SIGNALS:
        signal.signal(sig, on_signal)
    stack = Stack(config)
    say(f"starting the CRM stack (data in {data_dir})")
    try:
        stack.start()
    except StackError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 1
    except KeyboardInterrupt:
        say("stopped before the stack was up")
        return 130
    started.set()
    assert stack.infra is not None
    say("")
    say(f"CRM stack is healthy. Gateway: {stack.base_url}")
    for url in stack.gateway_urls[1:]:
        say(f"                     and: {url}")
    say(f"  PostgreSQL {stack.infra.database_url}")
    say(f"  Redis      {stack.infra.redis_url}")
    say(f"  NATS       {stack.infra.nats_url}")
    say(stack.relaxed_settings())
    say(f"Stop with Ctrl-C, or `{stop_command_for(data_dir)}` from another terminal.")
    stop.wait()
    say("stopping the CRM stack")
    stack.stop()
    say("stopped")
    return 0


def stop(data_dir: Path) -> int:
    """Stop the launcher running from `data_dir` (SIGTERM: its own graceful stop), then
    anything stack.json names that still runs; say what was stopped."""
    state = read_state(data_dir)
    launcher = recorded_launcher(state)
    running: list[Recorded] = [p for p in recorded_processes(state) if p.is_running()]
    lock = LauncherLock(data_dir)
    lock_was_held = not lock.acquire()
    if lock_was_held:
        if launcher is None or not launcher.is_running():
            sys.stderr.write(f"error: a launcher holds {lock.path} but {data_dir} names none\n")
            return 1
        say(f"stopping the CRM stack running from {data_dir} (launcher PID {launcher.pid})")
        os.kill(launcher.pid, signal.SIGTERM)
        if not (lock.wait(30) and launcher.wait_gone(10)):
            say(f"the launcher did not stop within 40 s: SIGKILL to PID {launcher.pid}")
            os.kill(launcher.pid, signal.SIGKILL)
            lock.wait(10)
    try:
        stop_recorded(running, grace=15)  # after a clean stop, nothing is left to stop here
    finally:
        lock.release()
    if launcher is not None and lock_was_held:
        running.insert(0, launcher)
    if not running:
        say(f"no CRM stack is running from {data_dir}")
        return 0
    say("stopped: " + ", ".join(f"{p.name} (PID {p.pid})" for p in running))
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m crmstack")
    parser.add_argument("command", choices=["run", "stop"])
    parser.add_argument("--data-dir", type=Path, default=Path(".data"))
    args = parser.parse_args()
    data_dir = args.data_dir.resolve()
    raise SystemExit(run(data_dir) if args.command == "run" else stop(data_dir))


if __name__ == "__main__":
    main()

"""`python -m crmstack run`: the whole stack in the foreground until Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path

from crmstack.processes import say
from crmstack.stack import Stack, StackConfig, StackError, persistent_app_secret


def run(data_dir: Path) -> int:
    port_text = os.environ.get("PORT", "3000")
    if not port_text.isdigit():
        sys.stderr.write(f"configuration error: PORT must be a port number, got {port_text!r}\n")
        return 2
    try:
        config = StackConfig(
            data_dir=data_dir,
            gateway_port=int(port_text),
            replicas=StackConfig.replicas_from_env(os.environ),
            echo_logs=True,
            restart_on_failure=True,
            app_secret=persistent_app_secret(data_dir),
            extra_env={"WEBHOOK_ALLOW_PRIVATE_TARGETS": "true"},
        )
    except StackError as exc:
        sys.stderr.write(f"configuration error: {exc}\n")
        return 2
    if len(config.app_secret) < 16:
        sys.stderr.write("configuration error: APP_SECRET must be at least 16 characters\n")
        return 2
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stack = Stack(config)
    say(f"starting the CRM stack (data in {data_dir})")
    try:
        stack.start()
    except StackError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 1
    assert stack.infra is not None
    say("")
    say(f"CRM stack is healthy. Gateway: {stack.base_url}")
    for url in stack.gateway_urls[1:]:
        say(f"                     and: {url}")
    say(f"  PostgreSQL {stack.infra.database_url}")
    say(f"  Redis      {stack.infra.redis_url}")
    say(f"  NATS       {stack.infra.nats_url}")
    say("Press Ctrl-C to stop.")
    stop.wait()
    say("stopping the CRM stack")
    stack.stop()
    say("stopped")
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m crmstack")
    parser.add_argument("command", choices=["run"])
    parser.add_argument("--data-dir", type=Path, default=Path(".data"))
    args = parser.parse_args()
    raise SystemExit(run(args.data_dir.resolve()))


if __name__ == "__main__":
    main()

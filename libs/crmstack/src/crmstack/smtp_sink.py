"""`python -m crmstack.smtp_sink --port N`: a local SMTP server that logs every message it gets.

`make run` starts it (unless SMTP_URL is set) so that password-reset emails are readable in the
terminal instead of leaving the machine.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from email import message_from_bytes, policy
from typing import Any

from aiosmtpd.controller import Controller


class LoggingHandler:
    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
        message = message_from_bytes(envelope.content, policy=policy.default)
        body = message.get_body(preferencelist=("plain",))
        text = body.get_content() if body is not None else ""
        lines = [
            f"mail from {envelope.mail_from} to {', '.join(envelope.rcpt_tos)}",
            f"  Subject: {message.get('Subject', '')}",
            *(f"  | {line}" for line in str(text).splitlines()),
        ]
        sys.stdout.write("\n".join(lines) + "\n")
        sys.stdout.flush()
        return "250 Message accepted for delivery"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m crmstack.smtp_sink")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args()
    controller = Controller(LoggingHandler(), hostname=args.host, port=args.port)
    controller.start()
    sys.stdout.write(f"SMTP sink listening on {args.host}:{args.port}\n")
    sys.stdout.flush()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    controller.stop()


if __name__ == "__main__":
    main()

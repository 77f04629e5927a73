"""A small webhook receiver that verifies every delivery before trusting it.

It checks `X-Service-Timestamp` (rejecting requests more than 300 s away from now, so a captured
request cannot be replayed later) and `X-Service-Signature` (HMAC-SHA256 of "<timestamp>.<body>"
keyed with the webhook's secret, compared in constant time), then handles each event once:
deliveries are at least once, so an event id seen again (on the same webhook) is acknowledged
without handling it twice.

Run it (standard library only, Python 3.10+):

    python examples/webhook_receiver.py --port 8000 --secret whsec_...

and create a webhook whose targetUrl is `http://<this host>:8000/` with that secret. Each
accepted event is printed (and appended to `--log FILE` as a JSON line). Use it as a library too:
`verify(...)` checks one request; `WebhookReceiver` serves many, with a secret per path.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOLERANCE_SECONDS = 300
SIGNATURE_HEADER = "X-Service-Signature"
TIMESTAMP_HEADER = "X-Service-Timestamp"
MAX_BODY_BYTES = 2 * 1024 * 1024


class VerificationError(Exception):
    """The request is not a genuine, fresh delivery; the message says which check failed."""


def verify(
    secret: str,
    body: bytes,
    signature: str | None,
    timestamp: str | None,
    *,
    now: float | None = None,
    tolerance: int = TOLERANCE_SECONDS,
) -> dict[str, Any]:
    """The delivery's payload, after checking its timestamp and signature (VerificationError)."""
    if not signature or not timestamp:
        raise VerificationError(f"missing {SIGNATURE_HEADER} or {TIMESTAMP_HEADER}")
    try:
        sent_at = int(timestamp)
    except ValueError:
        raise VerificationError("the timestamp is not a whole number of seconds") from None
    current = time.time() if now is None else now
    if abs(current - sent_at) > tolerance:
        raise VerificationError(f"the timestamp is more than {tolerance} s away from now")
    # Sign the bytes exactly as received: never re-serialise the JSON before checking.
    digest = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    expected = "sha256=" + digest.hexdigest()
    if not hmac.compare_digest(expected.encode(), signature.encode()):
        raise VerificationError("the signature does not match")
    try:
        payload = json.loads(body)
    except ValueError:
        raise VerificationError("the body is not JSON") from None
    if not isinstance(payload, dict) or not isinstance(payload.get("id"), str):
        raise VerificationError("the body is not a webhook payload")
    return payload


@dataclass(frozen=True)
class Delivery:
    path: str
    payload: dict[str, Any]
    headers: dict[str, str]
    received_at: float  # time.time() when the request was verified


# Your processing: given a verified, new event, return the HTTP status to answer (2xx = done).
Handler = Callable[[Delivery], int]


@dataclass
class WebhookReceiver:
    """An HTTP server that verifies deliveries and hands each new event to `handler`.

    `secrets` maps a URL path (e.g. "/hooks/crm") to the secret of the webhook posting there;
    `default_secret` serves every other path.
    """

    host: str = "127.0.0.1"
    port: int = 0
    secrets: dict[str, str] = field(default_factory=dict)
    default_secret: str | None = None
    handler: Handler | None = None
    log_path: str | None = None
    received: list[Delivery] = field(default_factory=list)  # every verified request
    rejected: list[tuple[str, str]] = field(default_factory=list)  # (path, reason)
    # Handled events by (path, event id): one event reaches each webhook with the same id.
    _done: dict[tuple[str, str], Delivery] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    # -- serving -------------------------------------------------------------------------------
    def start(self) -> WebhookReceiver:
        receiver = self

        class RequestHandler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive: the sender reuses connections

            def do_POST(self) -> None:  # the http.server naming
                length = int(self.headers.get("Content-Length") or 0)
                if length > MAX_BODY_BYTES:
                    self._answer(413, "too large")
                    return
                body = self.rfile.read(length)
                status, text = receiver.handle(self.path, dict(self.headers.items()), body)
                self._answer(status, text)

            def _answer(self, status: int, text: str) -> None:
                data = text.encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # quiet: accepted events are reported by the receiver itself

        self._server = ThreadingHTTPServer((self.host, self.port), RequestHandler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def url(self, path: str = "/") -> str:
        return f"http://{self.host}:{self.port}{path}"

    # -- one request ---------------------------------------------------------------------------
    def handle(self, path: str, headers: dict[str, str], body: bytes) -> tuple[int, str]:
        """The status and text to answer a POST to `path`."""
        with self._lock:
            secret = self.secrets.get(path, self.default_secret)
        if secret is None:
            return self._reject(path, "no secret configured for this path", 404)
        lowered = {key.lower(): value for key, value in headers.items()}
        try:
            payload = verify(
                secret,
                body,
                lowered.get(SIGNATURE_HEADER.lower()),
                lowered.get(TIMESTAMP_HEADER.lower()),
            )
        except VerificationError as exc:
            return self._reject(path, str(exc), 401)
        delivery = Delivery(path, payload, headers, time.time())
        with self._lock:
            self.received.append(delivery)
            if (path, payload["id"]) in self._done:
                return 200, "duplicate: already handled"
        status = self.handler(delivery) if self.handler is not None else 200
        if 200 <= status <= 299:
            with self._lock:
                self._done.setdefault((path, payload["id"]), delivery)
            self._report(delivery)
        return status, "ok" if 200 <= status <= 299 else "not handled"

    def _reject(self, path: str, reason: str, status: int) -> tuple[int, str]:
        with self._lock:
            self.rejected.append((path, reason))
        return status, reason

    def _report(self, delivery: Delivery) -> None:
        line = json.dumps(
            {
                "id": delivery.payload["id"],
                "operation": delivery.payload.get("operation"),
                "webhookId": delivery.payload.get("webhookId"),
                "receivedAt": delivery.received_at,
            }
        )
        if self.log_path:
            with self._lock, open(self.log_path, "a", encoding="utf-8") as log:
                log.write(line + "\n")
        else:
            print(line, flush=True)

    # -- what arrived --------------------------------------------------------------------------
    def events(self, path: str | None = None) -> list[Delivery]:
        """Handled events (one per event id), in arrival order; only `path`'s when given."""
        with self._lock:
            return [d for d in self._done.values() if path is None or d.path == path]

    def requests(self, path: str | None = None) -> list[Delivery]:
        """Every verified request, duplicates and unhandled ones included."""
        with self._lock:
            return [d for d in self.received if path is None or d.path == path]

    def set_secret(self, path: str, secret: str) -> None:
        with self._lock:
            self.secrets[path] = secret


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--secret", required=True, help="the webhook's secret (whsec_...)")
    parser.add_argument("--log", help="append each accepted event to this file (JSON lines)")
    args = parser.parse_args()
    receiver = WebhookReceiver(
        args.host, args.port, default_secret=args.secret, log_path=args.log
    ).start()
    print(f"listening on {receiver.url()}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        receiver.stop()


if __name__ == "__main__":
    main()

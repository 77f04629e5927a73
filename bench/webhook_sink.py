"""A fast webhook receiver for the benchmark: a bare ASGI app under uvicorn (httptools, uvloop).

Every POST is verified with `examples/webhook_receiver.verify` (timestamp window, HMAC,
constant-time compare), then answered 200; without `--secret` (workflow requests, which are not
signed) any JSON body with `id` and `timestamp` is taken as it comes. For each event it keeps
the delay from the commit (the payload's `timestamp`, the database's clock) to its arrival (this
machine's clock, the same one). `GET /results` answers
`{"count", "rejected", "events": [[id, delay_ms, arrived]]}`; `POST /reset` forgets everything.

    python bench/webhook_sink.py --port 8010 --secret whsec_...
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from examples.webhook_receiver import VerificationError, verify

Scope = dict[str, Any]


class Sink:
    def __init__(self, secret: str | None) -> None:
        self.secret = secret
        self.events: dict[str, tuple[float, float]] = {}  # id -> (delay ms, arrival)
        self.rejected = 0

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if scope["method"] == "GET":
            await self._answer(send, 200, self.results())
            return
        if scope["path"] == "/reset":
            self.events.clear()
            self.rejected = 0
            await self._answer(send, 200, b"{}")
            return
        arrived = time.time()
        headers = {key.decode().lower(): value.decode() for key, value in scope["headers"]}
        try:
            payload = (
                verify(
                    self.secret,
                    body,
                    headers.get("x-service-signature"),
                    headers.get("x-service-timestamp"),
                )
                if self.secret is not None
                else _unsigned(body)
            )
        except VerificationError as exc:
            self.rejected += 1
            await self._answer(send, 401, str(exc).encode())
            return
        committed = datetime.fromisoformat(payload["timestamp"].replace("Z", "+00:00"))
        delay_ms = (arrived - committed.timestamp()) * 1000
        self.events.setdefault(payload["id"], (delay_ms, arrived))
        await self._answer(send, 200, b"ok")

    def results(self) -> bytes:
        return orjson.dumps(
            {
                "count": len(self.events),
                "rejected": self.rejected,
                "events": [[key, delay, at] for key, (delay, at) in self.events.items()],
            }
        )

    @staticmethod
    async def _answer(send: Any, status: int, body: bytes) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())],
            }
        )  # fmt: skip
        await send({"type": "http.response.body", "body": body})


def _unsigned(body: bytes) -> dict[str, Any]:
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise VerificationError("the body is not JSON") from None
    if not isinstance(payload, dict) or not {"id", "timestamp"} <= payload.keys():
        raise VerificationError("the body has no id and timestamp")
    return payload


def main() -> None:
    parser = argparse.ArgumentParser(description="benchmark webhook receiver")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--secret", help="the webhook secret; none: unsigned requests")
    args = parser.parse_args()
    uvicorn.run(
        Sink(args.secret),
        host="127.0.0.1",
        port=args.port,
        http="httptools",
        loop="uvloop",
        log_level="warning",
        access_log=False,
    )


if __name__ == "__main__":
    main()

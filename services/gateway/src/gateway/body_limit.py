"""Request bodies are bounded before the app sees them (docs/api.md, Limits).

A body announced larger than its route's limit (Content-Length) is refused without reading a
byte of it; a body sent without a length (chunked) is read up to the limit and refused as soon
as it goes over. Either way the answer is 413 in the route's error shape and the connection is
closed. Bodies within the limit are read here and handed to the app whole (every route reads
its whole body anyway), so nothing reaches a route that could still turn out too large.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.settings import GatewaySettings

_GRAPHQL_PATHS = frozenset({"/graphql", "/metadata"})
_STATUS = 413
IMPORTS_PREFIX = "/rest/imports/"


@dataclass(frozen=True)
class BodyLimits:
    default: int
    batch: int  # POST /rest/batch/{object} and /graphql (batch creations)
    auth: int  # /auth/*: sign-up, login, tokens, OAuth
    imports: int = 1 << 30  # POST /rest/imports/{object}: streamed, counted by the route

    @classmethod
    def of(cls, settings: GatewaySettings) -> BodyLimits:
        return cls(
            default=settings.MAX_REQUEST_BODY_BYTES,
            batch=settings.MAX_BATCH_REQUEST_BODY_BYTES,
            auth=settings.MAX_AUTH_REQUEST_BODY_BYTES,
            imports=settings.IMPORT_MAX_BYTES,
        )

    def for_path(self, path: str) -> int:
        if path.startswith("/auth/"):
            return self.auth
        if path.startswith("/rest/batch/") or path == "/graphql":
            return self.batch
        return self.default


def refusal(path: str, limit: int) -> Response:
    """413 in the REST error shape, or the GraphQL one on the GraphQL endpoints."""
    message = f"the request body is larger than {limit} bytes, the maximum for this route"
    body: dict[str, object]
    if path in _GRAPHQL_PATHS:
        body = {
            "data": None,
            "errors": [{"message": message, "extensions": {"code": "BAD_USER_INPUT"}}],
        }
    else:
        body = {
            "statusCode": _STATUS,
            "message": message,
            "error": "Payload Too Large",
            "details": {"field": None, "message": message},
        }
    return Response(
        orjson.dumps(body),
        status_code=_STATUS,
        media_type="application/json",
        headers={"Connection": "close"},
    )


class BodySizeLimitMiddleware:
    def __init__(self, app: ASGIApp, limits: BodyLimits) -> None:
        self.app = app
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared, chunked = _framing(scope)
        if not declared and not chunked:
            await self.app(scope, receive, send)  # no body
            return
        path: str = scope["path"]
        streamed = path.startswith(IMPORTS_PREFIX) and scope["method"] == "POST"
        limit = self.limits.imports if streamed else self.limits.for_path(path)
        if declared is not None and declared > limit:
            await refusal(path, limit)(scope, receive, send)
            return
        if streamed:
            await self.app(scope, receive, send)  # the import route counts as it streams
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                await self.app(scope, _replaying(message, receive), send)  # client went away
                return
            chunk: bytes = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                await refusal(path, limit)(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        whole: Message = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        await self.app(scope, _replaying(whole, receive), send)


def _framing(scope: Scope) -> tuple[int | None, bool]:
    """The declared Content-Length (None when absent) and whether the body is chunked."""
    declared: int | None = None
    chunked = False
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                declared = int(value)
            except ValueError:
                declared = None
        elif name == b"transfer-encoding":
            chunked = b"chunked" in value.lower()
    return declared, chunked


def _replaying(first: Message, receive: Receive) -> Receive:
    """A receive that answers `first` once, then whatever the connection says next."""
    pending = [first]

    async def replay() -> Message:
        if pending:
            return pending.pop()
        return await receive()

    return replay

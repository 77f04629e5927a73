"""ASGI middleware that adds headers to each HTTP response as it starts (whatever route or error
produced it); subclasses say which."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

Headers = list[tuple[bytes, bytes]]


class ResponseHeadersMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    def added_headers(self, scope: Scope, headers: Headers) -> Headers:
        """The headers to add to a response that starts with `headers` (names lowercase)."""
        raise NotImplementedError

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                added = self.added_headers(scope, headers)
                if added:
                    message["headers"] = headers + added
            await send(message)

        await self.app(scope, receive, send_with_headers)

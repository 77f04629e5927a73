"""Every HTML page the gateway serves refuses to be framed (clickjacking).

The OAuth consent page sets its own, stricter headers (consent.security_headers); the pages
served in development (GraphQL playground, /docs) load their scripts from a CDN, so they only
get `X-Frame-Options: DENY` and a CSP limited to `frame-ancestors 'none'`. A header the page
already sets is kept.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

_FRAMING_HEADERS = (
    (b"x-frame-options", b"DENY"),
    (b"content-security-policy", b"frame-ancestors 'none'"),
)


class FramingHeadersMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                present = {name.lower(): value for name, value in headers}
                if present.get(b"content-type", b"").lower().startswith(b"text/html"):
                    headers += [(n, v) for n, v in _FRAMING_HEADERS if n not in present]
                    message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_headers)

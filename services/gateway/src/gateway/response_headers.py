"""Every HTTP response of the gateway passes one ASGI middleware, outside every route and error
handler: it adds the headers the request earned (each source says which: the rate limit's,
framing's) to the response as it starts, and counts and times the request by route template.
One layer rather than one per job: each layer is a coroutine and a `send` wrapper per message
on every request (docs/benchmarks.md, throughput).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from crmkit.metrics import Children
from gateway.metrics import GatewayMetrics
from gateway.routing import RouteTable

Headers = list[tuple[bytes, bytes]]
# The headers to add to the response of `scope` that starts with `headers` (names lowercase).
HeaderSource = Callable[[Scope, Headers], Headers]


class ResponseMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        sources: Sequence[HeaderSource],
        metrics: GatewayMetrics,
        routes: RouteTable,
    ) -> None:
        self.app = app
        self.sources = tuple(sources)
        self.metrics = metrics
        self.routes = routes
        self._durations = Children(metrics.http_duration)
        self._requests = Children(metrics.http_requests)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = list(message.get("headers", ()))
                added = [header for source in self.sources for header in source(scope, headers)]
                if added:
                    message["headers"] = headers + added
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            self._observe(scope, status, time.perf_counter() - started)

    def _observe(self, scope: Scope, status: int, seconds: float) -> None:
        template = self.routes.template(scope)
        method: str = scope["method"]
        self._durations(template, method).observe(seconds)
        self._requests(template, method, str(status)).inc()

"""The gateway's HTTP server span, made only when something could record it.

FastAPI's own OpenTelemetry support makes the server span of every request (named by route
template, continuing the caller's traceparent). When no exporter or sampler is configured
(crmkit.telemetry.configure_tracing), only a request under a sampled traceparent can be recorded;
for every other request that machinery (header parsing, span attributes, the query string
re-encoded, wrapped send and receive, ~10% of a REST call's CPU) produced a span that records
nothing. Such a request is now served inside the context crmkit.telemetry gives it: the caller's
trace, or a new one, continued by a non-recording span the SDK made, so trace ids still reach the
logs and every upstream call's traceparent, unchanged. Requests that could be recorded take
FastAPI's path as before (docs/decisions.md).
"""

from __future__ import annotations

from fastapi import FastAPI
from opentelemetry import context as otel_context
from opentelemetry import propagate
from opentelemetry.propagators.textmap import Getter
from starlette.types import Receive, Scope, Send

from crmkit.telemetry import unrecorded_server_context

# Set in a request's scope, it tells FastAPI the request's telemetry is already handled.
_FASTAPI_TELEMETRY = "fastapi.telemetry"
_BAGGAGE = "baggage"


class _HeaderGetter(Getter[dict[str, list[str]]]):
    """Trace headers by lowercase name, as FastAPI's getter reads them (baggage values joined)."""

    def get(self, carrier: dict[str, list[str]], key: str) -> list[str] | None:
        return carrier.get(key.lower())

    def keys(self, carrier: dict[str, list[str]]) -> list[str]:
        return list(carrier)


_GETTER = _HeaderGetter()


def trace_fields() -> frozenset[str]:
    """The headers the configured propagators read (W3C trace context and baggage by default)."""
    return frozenset(name.lower() for name in propagate.get_global_textmap().fields)


def caller_context(scope: Scope, fields: frozenset[str]) -> otel_context.Context:
    """The trace context of the request's headers named in `fields`."""
    carrier: dict[str, list[str]] = {}
    for raw_name, raw_value in scope["headers"]:
        name = raw_name.decode("latin-1").lower()
        if name in fields:
            carrier.setdefault(name, []).append(raw_value.decode("latin-1"))
    if _BAGGAGE in carrier:
        carrier[_BAGGAGE] = [",".join(carrier[_BAGGAGE])]
    return propagate.extract(carrier, getter=_GETTER)


class GatewayApp(FastAPI):
    """FastAPI with its server span skipped when it could not be recorded."""

    _trace_fields: frozenset[str] | None = None  # read on first use: propagators are set by then

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or _FASTAPI_TELEMETRY in scope:
            await super().__call__(scope, receive, send)
            return
        if self._trace_fields is None:
            self._trace_fields = trace_fields()
        context = unrecorded_server_context(caller_context(scope, self._trace_fields))
        if context is None:
            await super().__call__(scope, receive, send)  # FastAPI's recorded server span
            return
        scope[_FASTAPI_TELEMETRY] = None
        token = otel_context.attach(context)
        try:
            await super().__call__(scope, receive, send)
        finally:
            otel_context.detach(token)

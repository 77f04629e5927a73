"""The gateway's HTTP server span: made (and exported) when the caller's trace is sampled; when
nothing could record it, the request still runs in the caller's trace, so its id reaches the logs
and the upstream calls."""

from __future__ import annotations

import secrets

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from starlette.requests import Request
from starlette.responses import JSONResponse

from crmkit import telemetry
from crmkit.telemetry import metadata_from_context
from gateway.server_spans import GatewayApp


async def _seen(request: Request) -> JSONResponse:
    """What a handler sees of its trace: the current span and the traceparent it sends on."""
    context = trace.get_current_span().get_span_context()
    return JSONResponse(
        {
            "trace_id": format(context.trace_id, "032x"),
            "span_id": format(context.span_id, "016x"),
            "recording": trace.get_current_span().is_recording(),
            "upstream": dict(metadata_from_context()).get("traceparent"),
        }
    )


def _app() -> GatewayApp:
    app = GatewayApp(telemetry={"tracing": True, "metrics": False, "logs": False})
    app.add_route("/rest/{object}", _seen, methods=["GET"])
    return app


async def _get(app: GatewayApp, traceparent: str) -> dict[str, object]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
        response = await client.get("/rest/people", headers={"traceparent": traceparent})
    assert response.status_code == 200
    body: dict[str, object] = response.json()
    return body


async def test_an_unsampled_call_runs_in_the_callers_trace_without_a_span(
    spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(telemetry, "_only_sampled_parents", True)  # no exporter, no sampler
    trace_id, caller_span = secrets.token_hex(16), secrets.token_hex(8)
    seen = await _get(_app(), f"00-{trace_id}-{caller_span}-00")
    assert seen["trace_id"] == trace_id
    assert seen["span_id"] not in (caller_span, "0" * 16)  # a span of its own, as before
    assert seen["recording"] is False
    assert seen["upstream"] == f"00-{trace_id}-{seen['span_id']}-00"
    assert spans.get_finished_spans() == ()


async def test_a_sampled_call_gets_the_server_span_named_by_route(
    spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(telemetry, "_only_sampled_parents", True)
    trace_id, caller_span = secrets.token_hex(16), secrets.token_hex(8)
    seen = await _get(_app(), f"00-{trace_id}-{caller_span}-01")
    assert seen["trace_id"] == trace_id
    assert seen["recording"] is True
    (server,) = spans.get_finished_spans()
    assert server.name == "GET /rest/{object}"
    assert server.kind == trace.SpanKind.SERVER
    assert server.parent is not None
    assert format(server.parent.span_id, "016x") == caller_span
    assert format(server.context.span_id, "016x") == seen["span_id"]

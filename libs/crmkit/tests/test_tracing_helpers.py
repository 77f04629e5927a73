"""Spans made by crmkit's helpers: one per SQL statement inside a trace, and outbound HTTP
requests carrying the trace on (against a real HTTP server on loopback)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from crmkit.db import _traced
from crmkit.outbound import OutboundPolicy, guarded_session

tracer = trace.get_tracer("test")


async def _result(value: str) -> str:
    return value


async def _deadlock() -> None:
    raise RuntimeError("deadlock")


async def test_a_statement_inside_a_trace_is_a_client_span(spans: InMemorySpanExporter) -> None:
    query = "  insert into t values ($1)"
    with tracer.start_as_current_span("rpc") as parent:
        assert await _traced(query, _result("INSERT 0 1")) == "INSERT 0 1"
    (statement, rpc) = spans.get_finished_spans()
    assert statement.name == "INSERT"
    assert statement.kind == trace.SpanKind.CLIENT
    assert statement.parent is not None
    assert statement.parent.span_id == parent.get_span_context().span_id
    assert statement.attributes is not None
    assert statement.attributes["db.system.name"] == "postgresql"
    assert statement.attributes["db.query.text"] == query
    assert rpc.name == "rpc"


async def test_a_statement_outside_any_trace_makes_no_span(spans: InMemorySpanExporter) -> None:
    assert await _traced("SELECT 1", _result("1")) == "1"
    assert spans.get_finished_spans() == ()


async def test_a_failing_statement_is_an_error_span(spans: InMemorySpanExporter) -> None:
    with tracer.start_as_current_span("rpc"), pytest.raises(RuntimeError):
        await _traced("UPDATE t SET a = 1", _deadlock())
    statement = spans.get_finished_spans()[0]
    assert statement.name == "UPDATE"
    assert statement.status.status_code == trace.StatusCode.ERROR
    assert [event.name for event in statement.events] == ["exception"]


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[str, list[dict[str, str]]]]:
    seen: list[dict[str, str]] = []

    async def handle(request: web.Request) -> web.Response:
        seen.append(dict(request.headers))
        return web.Response(status=int(request.query.get("status", "200")))

    app = web.Application()
    app.router.add_post("/hook", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield f"http://127.0.0.1:{port}/hook", seen
    await runner.cleanup()


async def test_outbound_requests_in_a_trace_are_spans_carrying_traceparent(
    spans: InMemorySpanExporter, receiver: tuple[str, list[dict[str, str]]]
) -> None:
    url, seen = receiver
    session = guarded_session(OutboundPolicy(allow_private=True))
    try:
        with tracer.start_as_current_span("delivery") as parent:
            async with session.post(url + "?token=secret", data=b"{}") as response:
                assert response.status == 200
            async with session.post(url + "?status=503", data=b"{}") as response:
                assert response.status == 503
        async with session.post(url, data=b"{}") as response:  # outside any trace
            assert response.status == 200
    finally:
        await session.close()

    ok, failed, delivery = spans.get_finished_spans()
    trace_id = format(parent.get_span_context().trace_id, "032x")
    for span, headers in ((ok, seen[0]), (failed, seen[1])):
        assert span.name == "POST"
        assert span.kind == trace.SpanKind.CLIENT
        assert span.parent is not None
        assert span.parent.span_id == parent.get_span_context().span_id
        _, sent_trace, sent_span, _ = headers["traceparent"].split("-")
        assert sent_trace == trace_id
        assert sent_span == format(span.context.span_id, "016x")
    assert ok.attributes is not None
    assert ok.attributes["http.response.status_code"] == 200
    assert ok.attributes["server.address"] == "127.0.0.1"
    assert "secret" not in str(ok.attributes)  # no path or query recorded
    assert failed.status.status_code == trace.StatusCode.ERROR
    assert delivery.name == "delivery"
    assert "traceparent" not in seen[2]

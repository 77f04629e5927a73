"""W3C trace context between the services: what `trace_context_headers` writes,
`extract_context` and `context_from_metadata` read back, and that they agree with the
OpenTelemetry SDK's own W3C propagator on every input, valid or not."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from crmkit.telemetry import (
    context_from_metadata,
    extract_context,
    metadata_from_context,
    trace_context_headers,
)

W3C = TraceContextTextMapPropagator()
TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
SPAN_ID = 0x00F067AA0BA902B7
VALID = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def _span_context(headers: dict[str, str]) -> trace.SpanContext:
    return trace.get_current_span(extract_context(headers)).get_span_context()


def _sdk_span_context(headers: dict[str, str]) -> trace.SpanContext:
    return trace.get_current_span(W3C.extract(headers)).get_span_context()


def _in_span(span_context: trace.SpanContext) -> dict[str, str]:
    with trace.use_span(trace.NonRecordingSpan(span_context)):
        return trace_context_headers()


def test_headers_of_the_current_span_are_what_the_sdk_writes() -> None:
    state = trace.TraceState([("vendor", "value"), ("other", "x")])
    span_context = trace.SpanContext(
        TRACE_ID, SPAN_ID, is_remote=False, trace_flags=trace.TraceFlags(1), trace_state=state
    )
    with trace.use_span(trace.NonRecordingSpan(span_context)):
        ours = trace_context_headers()
        sdk: dict[str, str] = {}
        W3C.inject(sdk)
        carried = dict(metadata_from_context())
    assert ours == sdk == carried
    assert ours == {"traceparent": VALID, "tracestate": "vendor=value,other=x"}


def test_no_headers_outside_any_trace_and_the_carrier_is_added_to() -> None:
    assert trace_context_headers() == {}
    assert metadata_from_context() == []
    carrier = {"Nats-Msg-Id": "m1"}
    unsampled = trace.SpanContext(TRACE_ID, SPAN_ID, is_remote=False)
    with trace.use_span(trace.NonRecordingSpan(unsampled)):
        assert trace_context_headers(carrier) is carrier
    assert carrier == {
        "Nats-Msg-Id": "m1",
        "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
    }


def test_a_written_context_reads_back_as_the_remote_parent() -> None:
    state = trace.TraceState([("vendor", "value")])
    sent = trace.SpanContext(
        TRACE_ID, SPAN_ID, is_remote=False, trace_flags=trace.TraceFlags(1), trace_state=state
    )
    received = _span_context(_in_span(sent))
    assert (received.trace_id, received.span_id) == (TRACE_ID, SPAN_ID)
    assert received.trace_flags.sampled
    assert received.is_remote
    assert received.trace_state == state


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"traceparent": VALID},
        {"traceparent": VALID, "tracestate": "vendor=value"},
        {"traceparent": VALID, "tracestate": "not a valid state"},
        {"traceparent": VALID, "tracestate": "a=" + "b" * 9000},
        {"traceparent": VALID.upper()},
        {"traceparent": "00-00000000000000000000000000000000-00f067aa0ba902b7-01"},
        {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"},
        {"traceparent": "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
        {"traceparent": VALID + "-extra"},
        {"traceparent": "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-later"},
        {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01"},
        {"traceparent": "00-+bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
        {"traceparent": "00-4bf92f35_7b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
        {"traceparent": "garbage"},
        {"traceparent": ""},
    ],
)
def test_every_input_reads_as_the_sdk_reads_it(headers: dict[str, str]) -> None:
    assert _span_context(headers) == _sdk_span_context(headers)
    metadata: list[tuple[str, str | bytes]] = [("x-principal", b"opaque"), *headers.items()]
    from_metadata = trace.get_current_span(context_from_metadata(metadata)).get_span_context()
    assert from_metadata == _sdk_span_context(headers)


def test_metadata_values_that_are_not_text_are_ignored() -> None:
    metadata: list[tuple[str, str | bytes]] = [("traceparent", VALID.encode())]
    context = context_from_metadata(metadata)
    assert not trace.get_current_span(context).get_span_context().is_valid
    assert not trace.get_current_span(context_from_metadata(None)).get_span_context().is_valid

"""OpenTelemetry tracing, configured only by the standard OTEL_* variables.

An OTLP/HTTP exporter is installed when OTEL_EXPORTER_OTLP_ENDPOINT (or the traces-specific
variable) is set; otherwise spans are not recorded (unless OTEL_TRACES_SAMPLER says so or the
caller's sampled traceparent asks for it), but trace ids are still made, so logs carry them.
Context travels as W3C traceparent in HTTP headers, gRPC metadata and NATS headers; outbound
HTTP through `crmkit.outbound.guarded_session` carries it too (`http_client_tracing`). Between
the system's own services (gRPC metadata, NATS headers, the outbox's stored context) it is always
W3C trace context (`trace_context_headers`, `extract_context`), read and written here directly;
where the system meets other software (the gateway's incoming requests, outbound HTTP) the
propagators OTEL_PROPAGATORS configures are used (`inject_headers`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from types import SimpleNamespace

import aiohttp
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

TRACE_HEADERS = ("traceparent", "tracestate")
_http_tracer = trace.get_tracer("crmkit.http")
_ids = RandomIdGenerator()
_NOT_SAMPLED = trace.TraceFlags(trace.TraceFlags.DEFAULT)
_W3C = TraceContextTextMapPropagator()
# The traceparent this system writes (version 00, lowercase hex); any other valid form is read by
# the SDK's propagator, which also knows the later versions' rules.
_OWN_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_TRACESTATE_MAX_LENGTH = 8192  # the SDK propagator's own limit
# True when configure_tracing installed the "nothing exports" provider: a span is then recorded
# only below a sampled parent, and an unsampled one need not be started at all.
_only_sampled_parents = False


def configure_tracing(service_name: str) -> TracerProvider:
    """Install the global tracer provider for this process and return it (shut it down on exit)."""
    name = os.environ.get("OTEL_SERVICE_NAME") or service_name
    resource = Resource.create({"service.name": name})
    if _exporter_configured():
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider = TracerProvider(resource=resource)
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    elif os.environ.get("OTEL_TRACES_SAMPLER"):
        provider = TracerProvider(resource=resource)
    else:
        # Nothing would export the spans: ids are still made (logs carry them, context still
        # travels) but spans are not recorded unless the caller's traceparent asks for it.
        provider = TracerProvider(resource=resource, sampler=ParentBased(ALWAYS_OFF))
    global _only_sampled_parents
    _only_sampled_parents = not _exporter_configured() and not os.environ.get("OTEL_TRACES_SAMPLER")
    trace.set_tracer_provider(provider)
    return provider


def span_recordable(parent: otel_context.Context) -> bool:
    """Whether a span started below `parent` could be recorded: False only when this process
    records nothing but sampled traces and `parent` is not one (its span would be a no-op)."""
    if not _only_sampled_parents:
        return True
    return trace.get_current_span(parent).get_span_context().trace_flags.sampled


def unrecorded_server_context(parent: otel_context.Context) -> otel_context.Context | None:
    """The context to serve a request in when its server span could not be recorded (see
    span_recordable): the caller's trace (`parent`, from the request's headers), or a new one,
    continued by a span that records nothing, with the ids and flags the SDK's sampler
    (ParentBased(ALWAYS_OFF)) gives such a span: a new span id, the caller's trace id and trace
    state or a new trace id, not sampled. Made here rather than by the SDK's start_span, whose
    sampler and argument handling cost more than the rest of it. None when the span could be
    recorded: the caller then makes the full server span."""
    if span_recordable(parent):
        return None
    caller = trace.get_current_span(parent).get_span_context()
    if caller.is_valid:
        trace_id, state = caller.trace_id, caller.trace_state
    else:
        trace_id, state = _ids.generate_trace_id(), None
    span = trace.NonRecordingSpan(
        trace.SpanContext(
            trace_id,
            _ids.generate_span_id(),
            is_remote=False,
            trace_flags=_NOT_SAMPLED,
            trace_state=state,
        )
    )
    return trace.set_span_in_context(span, parent)


def _exporter_configured() -> bool:
    if os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    if os.environ.get("OTEL_TRACES_EXPORTER", "otlp").lower() == "none":
        return False
    return bool(
        os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def inject_headers(carrier: dict[str, str] | None = None) -> dict[str, str]:
    """The current trace context as headers for other software (outbound HTTP), by the
    configured propagators, added to `carrier` if given."""
    headers: dict[str, str] = {} if carrier is None else carrier
    propagate.inject(headers)
    return headers


def trace_context_headers(carrier: dict[str, str] | None = None) -> dict[str, str]:
    """The current span's W3C trace context (`traceparent`, `tracestate` if any), added to
    `carrier` if given: what the services send each other. Nothing outside any trace."""
    headers: dict[str, str] = {} if carrier is None else carrier
    span_context = trace.get_current_span().get_span_context()
    if span_context.is_valid:
        headers["traceparent"] = "00-%032x-%016x-%02x" % (  # noqa: UP031 (faster than f"")
            span_context.trace_id,
            span_context.span_id,
            span_context.trace_flags,
        )
        if span_context.trace_state:
            headers["tracestate"] = span_context.trace_state.to_header()
    return headers


def extract_context(headers: Mapping[str, str] | None) -> otel_context.Context:
    """The W3C trace context another service sent (`traceparent`, `tracestate`); an empty
    context when there is none or it is not valid."""
    if not headers:
        return otel_context.Context()
    traceparent = headers.get("traceparent")
    if not isinstance(traceparent, str):
        return otel_context.Context()
    tracestate = headers.get("tracestate")
    return _remote_parent(traceparent, tracestate if isinstance(tracestate, str) else None)


def _remote_parent(traceparent: str, tracestate: str | None) -> otel_context.Context:
    own = _OWN_TRACEPARENT.fullmatch(traceparent)
    if own is None or (tracestate is not None and len(tracestate) > _TRACESTATE_MAX_LENGTH):
        carrier = {"traceparent": traceparent}
        if tracestate is not None:
            carrier["tracestate"] = tracestate
        return _W3C.extract(carrier, otel_context.Context())
    trace_id, span_id = int(own.group(1), 16), int(own.group(2), 16)
    if not trace_id or not span_id:
        return otel_context.Context()
    span_context = trace.SpanContext(
        trace_id,
        span_id,
        is_remote=True,
        trace_flags=trace.TraceFlags(int(own.group(3), 16)),
        trace_state=trace.TraceState.from_header([tracestate]) if tracestate else None,
    )
    return trace.set_span_in_context(trace.NonRecordingSpan(span_context), otel_context.Context())


def context_from_metadata(
    metadata: Iterable[tuple[str, str | bytes]] | None,
) -> otel_context.Context:
    """The trace context carried by incoming gRPC metadata."""
    traceparent: str | None = None
    tracestate: str | None = None
    for key, value in metadata or ():
        if key == "traceparent" and isinstance(value, str):
            traceparent = value
        elif key == "tracestate" and isinstance(value, str):
            tracestate = value
    if traceparent is None:
        return otel_context.Context()
    return _remote_parent(traceparent, tracestate)


def metadata_from_context() -> list[tuple[str, str]]:
    """The current trace context as outgoing gRPC metadata."""
    return list(trace_context_headers().items())


def http_client_tracing() -> aiohttp.TraceConfig:
    """aiohttp hooks giving every outbound request made inside a trace a client span, whose
    context the request carries in `traceparent`. Inside a trace that is not recorded the
    request carries that trace's context with no span of its own; outside any trace, nothing.
    Only the target's host and port are recorded: paths and queries of user-configured URLs
    often hold tokens."""
    config = aiohttp.TraceConfig()

    async def on_start(
        _session: aiohttp.ClientSession,
        ctx: SimpleNamespace,
        params: aiohttp.TraceRequestStartParams,
    ) -> None:
        current = trace.get_current_span()
        if not current.is_recording():
            if current.get_span_context().is_valid:  # unrecorded trace: its id still travels
                propagate.inject(params.headers)
            return
        span = _http_tracer.start_span(
            params.method,
            kind=trace.SpanKind.CLIENT,
            attributes={
                "http.request.method": params.method,
                "url.scheme": params.url.scheme,
                "server.address": params.url.host or "",
                "server.port": params.url.port or 0,
            },
        )
        ctx.span = span
        with trace.use_span(span, end_on_exit=False):
            propagate.inject(params.headers)

    async def on_end(
        _session: aiohttp.ClientSession,
        ctx: SimpleNamespace,
        params: aiohttp.TraceRequestEndParams,
    ) -> None:
        span: trace.Span | None = getattr(ctx, "span", None)
        if span is None:
            return
        status = params.response.status
        span.set_attribute("http.response.status_code", status)
        if status >= 400:
            span.set_status(trace.Status(trace.StatusCode.ERROR))
            span.set_attribute("error.type", str(status))
        span.end()

    async def on_exception(
        _session: aiohttp.ClientSession,
        ctx: SimpleNamespace,
        params: aiohttp.TraceRequestExceptionParams,
    ) -> None:
        span: trace.Span | None = getattr(ctx, "span", None)
        if span is None:
            return
        span.set_attribute("error.type", type(params.exception).__name__)
        span.set_status(trace.Status(trace.StatusCode.ERROR, str(params.exception)))
        span.end()

    config.on_request_start.append(on_start)
    config.on_request_end.append(on_end)
    config.on_request_exception.append(on_exception)
    return config

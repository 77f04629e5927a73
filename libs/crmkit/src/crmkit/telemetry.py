"""OpenTelemetry tracing, configured only by the standard OTEL_* variables.

An OTLP/HTTP exporter is installed when OTEL_EXPORTER_OTLP_ENDPOINT (or the traces-specific
variable) is set; otherwise spans are still created, so logs carry trace ids, but not exported.
Context travels as W3C traceparent in HTTP headers, gRPC metadata and NATS headers.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

TRACE_HEADERS = ("traceparent", "tracestate")


def configure_tracing(service_name: str) -> TracerProvider:
    """Install the global tracer provider for this process and return it (shut it down on exit)."""
    name = os.environ.get("OTEL_SERVICE_NAME") or service_name
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    if _exporter_configured():
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    return provider


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
    """The current trace context as headers (HTTP, NATS), added to `carrier` if given."""
    headers: dict[str, str] = {} if carrier is None else carrier
    propagate.inject(headers)
    return headers


def extract_context(headers: Mapping[str, str] | None) -> otel_context.Context:
    return propagate.extract(dict(headers or {}))


def context_from_metadata(
    metadata: Iterable[tuple[str, str | bytes]] | None,
) -> otel_context.Context:
    """The trace context carried by incoming gRPC metadata."""
    carrier = {
        key: value
        for key, value in metadata or ()
        if key in TRACE_HEADERS and isinstance(value, str)
    }
    return propagate.extract(carrier)


def metadata_from_context() -> list[tuple[str, str]]:
    """The current trace context as outgoing gRPC metadata."""
    return list(inject_headers().items())

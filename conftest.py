"""Fixtures shared by every test folder."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

_EXPORTER = InMemorySpanExporter()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The spans this test ends, as the process's tracer provider (an SDK one, installed once
    per test process as `configure_tracing` does in a service) records them."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()

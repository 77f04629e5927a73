"""A real OTLP/HTTP trace receiver on loopback: POST /v1/traces (protobuf), spans kept in memory.

It decodes what the services' exporters send exactly as a collector would
(`ExportTraceServiceRequest`), and names each span's process by its `service.name` resource.
"""

from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as SpanProto


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    kind: str  # SERVER, CLIENT, PRODUCER, CONSUMER, INTERNAL
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]


def _value(value: AnyValue) -> Any:
    field = value.WhichOneof("value")
    return getattr(value, field) if field else None


def decode(body: bytes) -> list[ReceivedSpan]:
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        service = str(resource.get("service.name", ""))
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    ReceivedSpan(
                        service=service,
                        name=span.name,
                        kind=SpanProto.SpanKind.Name(span.kind).removeprefix("SPAN_KIND_"),
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        attributes={a.key: _value(a.value) for a in span.attributes},
                    )
                )
    return spans


class OtlpReceiver:
    def __init__(self) -> None:
        self._spans: list[ReceivedSpan] = []
        self._lock = threading.Lock()
        self.rejected: list[str] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces" or "protobuf" not in (
                    self.headers.get("Content-Type") or ""
                ):
                    receiver.rejected.append(f"{self.path} {self.headers.get('Content-Type')}")
                    self.send_response(404)
                    self.end_headers()
                    return
                spans = decode(body)
                with receiver._lock:
                    receiver._spans.extend(spans)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        """The value for OTEL_EXPORTER_OTLP_ENDPOINT (exporters append /v1/traces)."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def spans(self, trace_id: str | None = None) -> list[ReceivedSpan]:
        with self._lock:
            return [s for s in self._spans if trace_id is None or s.trace_id == trace_id]

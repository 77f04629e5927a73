"""gRPC interceptors shared by every process.

Server side: one span per call (continuing the caller's trace), metrics, and the mapping of
exceptions to a status with google.rpc details. Client side: a deadline on every call that has
none, and the current trace context in the metadata.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import asyncpg
import grpc
from opentelemetry import context as otel_context
from opentelemetry import trace

from crmkit.errors import ServiceError, from_database_value_error, to_rpc_status
from crmkit.metrics import GrpcServerMetrics
from crmkit.telemetry import context_from_metadata, metadata_from_context

log = logging.getLogger("crmkit.grpc")
_tracer = trace.get_tracer("crmkit.grpc")

Behavior = Callable[[Any, grpc.aio.ServicerContext], Any]


def _split_method(full_method: str) -> tuple[str, str]:
    _, service, method = full_method.split("/", 2)
    return service, method


class ServerInterceptor(grpc.aio.ServerInterceptor):
    """Spans, metrics and error mapping around every unary and server-streaming handler."""

    def __init__(self, metrics: GrpcServerMetrics) -> None:
        self._metrics = metrics

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        method: str = handler_call_details.method
        if (
            handler is None
            or method.startswith("/grpc.health.")
            or method.startswith("/grpc.reflection.")
        ):
            return handler
        service, name = _split_method(method)
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._wrap_unary(handler.unary_unary, method, service, name),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._wrap_stream(handler.unary_stream, method, service, name),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler

    def _wrap_unary(self, behavior: Behavior, method: str, service: str, name: str) -> Behavior:
        async def wrapper(request: Any, context: grpc.aio.ServicerContext) -> Any:
            token = otel_context.attach(context_from_metadata(context.invocation_metadata()))
            started = time.perf_counter()
            code = grpc.StatusCode.OK
            self._metrics.in_flight.inc()
            try:
                with _tracer.start_as_current_span(
                    method.lstrip("/"),
                    kind=trace.SpanKind.SERVER,
                    attributes={"rpc.system": "grpc", "rpc.service": service, "rpc.method": name},
                ) as span:
                    try:
                        result = behavior(request, context)
                        if inspect.isawaitable(result):
                            result = await result
                        return result
                    except (ServiceError, asyncpg.exceptions.DataError) as exc:
                        error = (
                            exc if isinstance(exc, ServiceError) else from_database_value_error(exc)
                        )
                        code = error.code
                        span.set_attribute("rpc.grpc.status_code", code.value[0])
                        await context.abort_with_status(to_rpc_status(error))
                    except NotImplementedError:
                        code = grpc.StatusCode.UNIMPLEMENTED
                        await context.abort(code, f"{method} is not implemented")
                    except grpc.aio.AbortError:
                        code = _context_code(context)
                        raise
                    except Exception as exc:  # the one place unexpected errors become INTERNAL
                        code = grpc.StatusCode.INTERNAL
                        span.record_exception(exc)
                        span.set_status(trace.Status(trace.StatusCode.ERROR))
                        log.exception("unhandled error in %s", method)
                        await context.abort(code, "internal server error")
            finally:
                self._metrics.in_flight.dec()
                self._metrics.duration.labels(service, name).observe(time.perf_counter() - started)
                self._metrics.requests.labels(service, name, code.name).inc()
                otel_context.detach(token)

        return wrapper

    def _wrap_stream(self, behavior: Behavior, method: str, service: str, name: str) -> Behavior:
        async def wrapper(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            started = time.perf_counter()
            code = grpc.StatusCode.OK
            try:
                async for item in behavior(request, context):
                    yield item
            except ServiceError as exc:
                code = exc.code
                await context.abort_with_status(to_rpc_status(exc))
            except grpc.aio.AbortError:
                code = _context_code(context)
                raise
            except Exception:
                code = grpc.StatusCode.INTERNAL
                log.exception("unhandled error in %s", method)
                await context.abort(code, "internal server error")
            finally:
                self._metrics.duration.labels(service, name).observe(time.perf_counter() - started)
                self._metrics.requests.labels(service, name, code.name).inc()

        return wrapper


def _context_code(context: grpc.aio.ServicerContext) -> grpc.StatusCode:
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return code
    return grpc.StatusCode.UNKNOWN


class ClientInterceptor(grpc.aio.UnaryUnaryClientInterceptor):
    """Gives every outgoing unary call a deadline and the current trace context."""

    def __init__(self, default_timeout: float) -> None:
        self._default_timeout = default_timeout

    async def intercept_unary_unary(
        self,
        continuation: Callable[[grpc.aio.ClientCallDetails, Any], Any],
        client_call_details: grpc.aio.ClientCallDetails,
        request: Any,
    ) -> Any:
        method = client_call_details.method
        method_name = method.decode() if isinstance(method, bytes) else method
        with _tracer.start_as_current_span(
            method_name.lstrip("/"), kind=trace.SpanKind.CLIENT, attributes={"rpc.system": "grpc"}
        ):
            metadata = list(client_call_details.metadata or ())
            metadata.extend(metadata_from_context())
            details = grpc.aio.ClientCallDetails(
                method=client_call_details.method,
                timeout=client_call_details.timeout
                if client_call_details.timeout is not None
                else self._default_timeout,
                metadata=grpc.aio.Metadata(*metadata),
                credentials=client_call_details.credentials,
                wait_for_ready=client_call_details.wait_for_ready,
            )
            call = await continuation(details, request)
            await call  # keep the span open until the response (or error) arrives
            return call

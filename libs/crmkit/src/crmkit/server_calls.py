"""What every gRPC server does around each call: one span per call (continuing the caller's
trace), metrics, and the mapping of exceptions to a status with google.rpc details, wrapped
around each method handler as servicers are added (`ServerCalls`, `Registration`). The client
side (a deadline on every call that has none, the current trace context in the metadata) is
crmkit.grpc_client's channel.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import nullcontext
from typing import Any

import asyncpg
import grpc
from opentelemetry import context as otel_context
from opentelemetry import trace

from crmkit.db import from_database_value_error
from crmkit.errors import (
    ServiceError,
    Unavailable,
    to_rpc_status,
    unavailable_dependency,
)
from crmkit.metrics import Children, GrpcServerMetrics
from crmkit.outages import OutageLog
from crmkit.telemetry import context_from_metadata, span_recordable

log = logging.getLogger("crmkit.grpc")
_tracer = trace.get_tracer("crmkit.grpc")

Behavior = Callable[[Any, grpc.aio.ServicerContext], Any]


def _split_method(full_method: str) -> tuple[str, str]:
    _, service, method = full_method.split("/", 2)
    return service, method


class ServerCalls:
    """Spans, metrics and error mapping around every unary, client- and server-streaming handler.

    Applied to each method handler as a servicer is added to the server (`registering`), not as a
    grpc.aio server interceptor: an interceptor runs every call through an awaited lookup of its
    handler, which cost more CPU per call than the wrapper itself (~40 us of a call's ~300 on the
    server side, docs/benchmarks.md). Health checking and reflection are added to the server
    directly and stay unwrapped. A call below an unsampled trace starts no span when nothing
    could record it (crmkit.telemetry.span_recordable), but its trace context is still current,
    so its logs carry the trace id.
    """

    def __init__(self, metrics: GrpcServerMetrics) -> None:
        self._metrics = metrics
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}
        self._outages: dict[str, OutageLog] = {}
        self._outcomes = Children(metrics.requests)

    def registering(
        self, server: grpc.aio.Server, served: list[grpc.GenericRpcHandler] | None = None
    ) -> Registration:
        """What a generated `add_*Servicer_to_server` is given in place of `server`."""
        return Registration(server, self, served)

    def _unavailable(self, dependency: str, exc: Exception) -> grpc.Status:
        """A connection-level failure of PostgreSQL or NATS: UNAVAILABLE, logged once per
        outage (not a traceback per call)."""
        outage = self._outages.get(dependency)
        if outage is None:
            outage = OutageLog(dependency, log, self._metrics.outages)
            self._outages[dependency] = outage
        outage.failed(exc)
        return to_rpc_status(Unavailable(f"{dependency} unavailable, try again"))

    def _answered(self) -> None:
        for outage in self._outages.values():
            outage.recovered()

    def wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """`handler` of the full `method` name with spans, metrics and error mapping (built
        once per method)."""
        known = self._handlers.get(method)
        if known is not None:
            return known
        service, name = _split_method(method)
        wrapped = handler
        if handler.unary_unary is not None:
            wrapped = grpc.unary_unary_rpc_method_handler(
                self._wrap_unary(handler.unary_unary, method, service, name),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        elif handler.stream_unary is not None:
            # Client streaming (an import's upload): the same wrapper, the request an iterator.
            wrapped = grpc.stream_unary_rpc_method_handler(
                self._wrap_unary(handler.stream_unary, method, service, name),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        elif handler.unary_stream is not None:
            wrapped = grpc.unary_stream_rpc_method_handler(
                self._wrap_stream(handler.unary_stream, method, service, name),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        self._handlers[method] = wrapped
        return wrapped

    def _wrap_unary(self, behavior: Behavior, method: str, service: str, name: str) -> Behavior:
        duration = self._metrics.duration.labels(service, name)
        outcomes = self._outcomes
        span_name = method.lstrip("/")
        attributes = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": name}

        async def wrapper(request: Any, context: grpc.aio.ServicerContext) -> Any:
            parent = context_from_metadata(context.invocation_metadata())
            token = otel_context.attach(parent)
            started = time.perf_counter()
            code = grpc.StatusCode.OK
            self._metrics.in_flight.inc()
            try:
                span_scope = (
                    _tracer.start_as_current_span(
                        span_name, kind=trace.SpanKind.SERVER, attributes=attributes
                    )
                    if span_recordable(parent)
                    else nullcontext(trace.INVALID_SPAN)
                )
                with span_scope as span:
                    try:
                        result = behavior(request, context)
                        if inspect.isawaitable(result):
                            result = await result
                        if self._outages:
                            self._answered()
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
                        dependency = unavailable_dependency(exc)
                        if dependency is not None:
                            code = grpc.StatusCode.UNAVAILABLE
                            span.set_attribute("rpc.grpc.status_code", code.value[0])
                            await context.abort_with_status(self._unavailable(dependency, exc))
                        code = grpc.StatusCode.INTERNAL
                        span.record_exception(exc)
                        span.set_status(trace.Status(trace.StatusCode.ERROR))
                        log.exception("unhandled error in %s", method)
                        await context.abort(code, "internal server error")
            finally:
                self._metrics.in_flight.dec()
                duration.observe(time.perf_counter() - started)
                outcomes(service, name, code.name).inc()
                otel_context.detach(token)

        return wrapper

    def _wrap_stream(self, behavior: Behavior, method: str, service: str, name: str) -> Behavior:
        duration = self._metrics.duration.labels(service, name)
        outcomes = self._outcomes

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
            except Exception as exc:
                dependency = unavailable_dependency(exc)
                if dependency is not None:
                    code = grpc.StatusCode.UNAVAILABLE
                    await context.abort_with_status(self._unavailable(dependency, exc))
                code = grpc.StatusCode.INTERNAL
                log.exception("unhandled error in %s", method)
                await context.abort(code, "internal server error")
            finally:
                duration.observe(time.perf_counter() - started)
                outcomes(service, name, code.name).inc()

        return wrapper


class Registration:
    """The server as a generated `add_*Servicer_to_server` sees it: its generic handlers, each
    method handler wrapped by `ServerCalls.wrap` on the way in.

    The generated code also registers every method with the server ("registered methods").
    That is not passed on: grpc.aio's server then keeps a pending request for each registered
    method and waits on all of them (asyncio.wait) for every call it accepts, a cost that grows
    with the number of methods (~35 in records: ~30k instructions a call). Calls of methods that
    are not registered reach the generic handlers, one pending request for all. `served`
    collects the handlers added, for the multiplexed stream (crmkit.multiplex_server).
    """

    def __init__(
        self,
        server: grpc.aio.Server,
        calls: ServerCalls | None = None,
        served: list[grpc.GenericRpcHandler] | None = None,
    ) -> None:
        self._server = server
        self._calls = calls
        self._served = served

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        calls = self._calls
        if calls is not None:
            handlers = [_WrappedGenericHandler(handler, calls) for handler in handlers]
        self._server.add_generic_rpc_handlers(tuple(handlers))
        if self._served is not None:
            self._served.extend(handlers)

    def add_registered_method_handlers(
        self, service_name: str, method_handlers: dict[str, grpc.RpcMethodHandler]
    ) -> None:
        """Not registered (see the class): the generic handlers serve these methods."""


class _WrappedGenericHandler(grpc.GenericRpcHandler):
    """A generic handler (calls by an unregistered method name) answering wrapped handlers."""

    def __init__(self, inner: grpc.GenericRpcHandler, calls: ServerCalls) -> None:
        self._inner = inner
        self._calls = calls

    def service(
        self, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        handler = self._inner.service(handler_call_details)
        if handler is None:
            return None
        return self._calls.wrap(handler_call_details.method, handler)


def _context_code(context: grpc.aio.ServicerContext) -> grpc.StatusCode:
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return code
    return grpc.StatusCode.UNKNOWN

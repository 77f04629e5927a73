"""Errors that cross gRPC: a status code plus google.rpc details (BadRequest, ErrorInfo).

Services raise ServiceError subclasses; the server's call wrapper (crmkit.server_calls) turns them
into a status with details. Clients turn an AioRpcError back into the same ServiceError with
`from_rpc_error`, so the gateway maps one type to REST and GraphQL in one place.
"""

from __future__ import annotations

from typing import ClassVar

import asyncpg
import grpc
import nats.errors
import nats.js.errors
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from crm.common.v1 import common_pb2

DOMAIN = "crm"


class ServiceError(Exception):
    """An error meant for the caller: its message is safe to show."""

    code: ClassVar[grpc.StatusCode] = grpc.StatusCode.UNKNOWN
    default_reason: ClassVar[int] = common_pb2.ERROR_REASON_UNSPECIFIED

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        reason: int | None = None,
        metadata: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.reason = self.default_reason if reason is None else reason
        self.metadata = metadata or {}

    @property
    def reason_name(self) -> str:
        return common_pb2.ErrorReason.Name(self.reason)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, field={self.field!r})"


class InvalidArgument(ServiceError):
    code = grpc.StatusCode.INVALID_ARGUMENT
    default_reason = common_pb2.ERROR_REASON_INVALID_INPUT


class NotFound(ServiceError):
    code = grpc.StatusCode.NOT_FOUND
    default_reason = common_pb2.ERROR_REASON_NOT_FOUND


class AlreadyExists(ServiceError):
    code = grpc.StatusCode.ALREADY_EXISTS
    default_reason = common_pb2.ERROR_REASON_ALREADY_EXISTS


class PermissionDenied(ServiceError):
    code = grpc.StatusCode.PERMISSION_DENIED
    default_reason = common_pb2.ERROR_REASON_PERMISSION_DENIED


class Unauthenticated(ServiceError):
    code = grpc.StatusCode.UNAUTHENTICATED
    default_reason = common_pb2.ERROR_REASON_TOKEN_INVALID


class FailedPrecondition(ServiceError):
    code = grpc.StatusCode.FAILED_PRECONDITION
    default_reason = common_pb2.ERROR_REASON_CONFLICT


class ResourceExhausted(ServiceError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    default_reason = common_pb2.ERROR_REASON_RATE_LIMITED


class Unavailable(ServiceError):
    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(ServiceError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Internal(ServiceError):
    code = grpc.StatusCode.INTERNAL


_BY_CODE: dict[grpc.StatusCode, type[ServiceError]] = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        NotFound,
        AlreadyExists,
        PermissionDenied,
        Unauthenticated,
        FailedPrecondition,
        ResourceExhausted,
        Unavailable,
        DeadlineExceeded,
        Internal,
    )
}


# PostgreSQL refusing or dropping the connection (class 08), shutting down or not yet accepting
# (57P01-57P03), out of connections (53300), or cancelling a statement past statement_timeout
# (57014: the transaction is rolled back, so the answer is a definite "not written").
# Shutdown, too many connections, statement timeout; a deadlock or serialization failure
# (the transaction was rolled back: a retry may pass).
_DATABASE_UNAVAILABLE_STATES = frozenset(
    {"57P01", "57P02", "57P03", "53300", "57014", "40P01", "40001"}
)
_NATS_UNAVAILABLE = (
    nats.errors.ConnectionClosedError,
    nats.errors.NoServersError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.StaleConnectionError,
    nats.errors.NoRespondersError,
    nats.errors.TimeoutError,
    nats.js.errors.ServiceUnavailableError,
)


def unavailable_dependency(exc: BaseException) -> str | None:
    """`database` or `nats` when `exc` is a connection-level failure of it (refused, reset, timed
    out, closed mid-query, shutting down), which a caller may retry; None for anything else."""
    if isinstance(exc, _NATS_UNAVAILABLE):
        return "nats"
    if isinstance(exc, asyncpg.PostgresConnectionError):
        return "database"
    if isinstance(exc, asyncpg.PostgresError):
        return "database" if exc.sqlstate in _DATABASE_UNAVAILABLE_STATES else None
    if isinstance(exc, asyncpg.InterfaceError):
        return "database" if "connection is closed" in str(exc) else None
    if isinstance(exc, asyncpg.exceptions.InternalClientError):
        # A connection lost under a statement can leave asyncpg's protocol mid-operation: the
        # next statement on it (a pooled connection's BEGIN) fails so (the fault campaign).
        return "database" if "cannot switch to state" in str(exc) else None
    if isinstance(exc, OSError):  # refused, reset or timed out (TimeoutError) at pool acquire
        return "database"
    return None


def to_status(error: ServiceError) -> status_pb2.Status:
    """The google.rpc.Status carrying the error's field and reason."""
    details: list[any_pb2.Any] = []
    if error.field is not None:
        bad_request = error_details_pb2.BadRequest(
            field_violations=[
                error_details_pb2.BadRequest.FieldViolation(
                    field=error.field, description=error.message
                )
            ]
        )
        packed = any_pb2.Any()
        packed.Pack(bad_request)
        details.append(packed)
    info = error_details_pb2.ErrorInfo(
        reason=error.reason_name, domain=DOMAIN, metadata=error.metadata
    )
    packed_info = any_pb2.Any()
    packed_info.Pack(info)
    details.append(packed_info)
    return status_pb2.Status(code=error.code.value[0], message=error.message, details=details)


def to_rpc_status(error: ServiceError) -> grpc.Status:
    return rpc_status.to_status(to_status(error))


def from_rpc_error(exc: grpc.aio.AioRpcError | grpc.RpcError) -> ServiceError:
    """The ServiceError a failed call carries (INTERNAL-safe message when it carries none)."""
    code: grpc.StatusCode = exc.code()
    cls = _BY_CODE.get(code, Internal)
    message: str = exc.details() or code.name.lower().replace("_", " ")
    field: str | None = None
    reason: int | None = None
    metadata: dict[str, str] = {}
    status = _status_of(exc)
    if status is not None:
        for detail in status.details:
            if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                bad_request = error_details_pb2.BadRequest()
                detail.Unpack(bad_request)
                if bad_request.field_violations:
                    field = bad_request.field_violations[0].field
            elif detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                metadata = dict(info.metadata)
                if info.domain == DOMAIN:
                    reason = _reason_value(info.reason)
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        message = (
            "upstream service unavailable"
            if code == grpc.StatusCode.UNAVAILABLE
            else ("upstream service timed out")
        )
    elif cls is Internal:
        message = "internal server error"
    return cls(message, field=field, reason=reason, metadata=metadata)


def _reason_value(name: str) -> int | None:
    try:
        return int(common_pb2.ErrorReason.Value(name))
    except ValueError:
        return None


def _status_of(exc: grpc.RpcError) -> status_pb2.Status | None:
    try:
        return rpc_status.from_call(exc)
    except (ValueError, AttributeError):
        return None

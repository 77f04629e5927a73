"""POST /graphql and /metadata: authenticate, pick the schema, execute, answer errors in the
spec's shape. GET serves the GraphiQL playground in development only.

/graphql runs against the caller's workspace schema (generated from its data model, cached per
content fingerprint). A request the cached schema rejects as invalid (an unknown field, type or
argument: perhaps a custom object created a moment ago through another gateway) re-checks the
data model once and, when it changed, runs against the new schema; nothing was executed before,
so the retry is safe for mutations too.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import orjson
import strawberry
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from strawberry.http.ides import get_graphql_ide_html
from strawberry.types import ExecutionResult
from strawberry.types.graphql import OperationType

from crm.common.v1 import common_pb2
from crmkit.errors import InvalidArgument, NotFound, ServiceError
from crmkit.jsondepth import MAX_DOCUMENT_DEPTH, check_depth
from gateway.auth import authenticate
from gateway.datamodel.model import DataModel
from gateway.errors import graphql_extensions, mapping_for
from gateway.graphql.builder import StaticNames, WorkspaceGraphQL, build_workspace_schema
from gateway.graphql.context import GraphQLContext
from gateway.graphql.errors import format_graphql_error, parse_quietly
from gateway.graphql.parts import SchemaPart
from gateway.state import GatewayState, gateway_state

Endpoint = Callable[[Request], Awaitable[Response]]
_HTTP_OPERATIONS = frozenset({OperationType.QUERY, OperationType.MUTATION})
GRAPHQL_SCHEMA = "graphql"


def graphql_response(result: ExecutionResult, query: str = "", status: int = 200) -> Response:
    body: dict[str, Any] = {"data": result.data}
    if result.errors:
        document = parse_quietly(query) if query else None
        body["errors"] = [format_graphql_error(error, document) for error in result.errors]
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


def error_response(error: ServiceError) -> Response:
    """A request-level failure (bad body, credential, rate limit) with its HTTP status."""
    body = {
        "data": None,
        "errors": [{"message": error.message, "extensions": graphql_extensions(error)}],
    }
    return Response(
        orjson.dumps(body),
        status_code=mapping_for(error).http_status,
        media_type="application/json",
    )


async def parse_graphql_request(request: Request) -> tuple[str, dict[str, Any] | None, str | None]:
    """query, variables and operationName of a POSTed GraphQL request, or InvalidArgument."""
    try:
        payload = orjson.loads(await request.body())
    except orjson.JSONDecodeError:
        raise InvalidArgument("request body is not valid JSON") from None
    if not isinstance(payload, dict):
        raise InvalidArgument("request body must be a JSON object")
    query = payload.get("query")
    if not isinstance(query, str) or not query.strip():
        raise InvalidArgument("`query` must be a non-empty string", field="query")
    variables = payload.get("variables")
    if variables is not None and not isinstance(variables, dict):
        raise InvalidArgument("`variables` must be an object", field="variables")
    check_depth(variables, MAX_DOCUMENT_DEPTH, field="variables", what="`variables`")
    operation_name = payload.get("operationName")
    if operation_name is not None and not isinstance(operation_name, str):
        raise InvalidArgument("`operationName` must be a string", field="operationName")
    return query, variables, operation_name


async def _execute(
    schema: strawberry.Schema,
    context: GraphQLContext,
    query: str,
    variables: dict[str, Any] | None,
    operation_name: str | None,
) -> ExecutionResult:
    return await schema.execute(
        query,
        variable_values=variables,
        operation_name=operation_name,
        context_value=context,
        allowed_operation_types=_HTTP_OPERATIONS,
    )


def _rejected_before_execution(result: ExecutionResult) -> bool:
    """Parse, validation or variable errors: no resolver ran."""
    return (
        result.data is None
        and bool(result.errors)
        and all(error.path is None for error in result.errors or ())
    )


def _respond(context: GraphQLContext, result: ExecutionResult, query: str) -> Response:
    response = graphql_response(result, query)
    response.headers.update(context.response_headers)
    return response


def _playground(request: Request, development: bool) -> Response:
    if development:
        return HTMLResponse(get_graphql_ide_html())
    raise NotFound("the GraphQL playground is served only in development")


async def _authenticated(
    request: Request,
) -> tuple[common_pb2.Principal, str, dict[str, Any] | None, str | None]:
    principal = await authenticate(request)
    query, variables, operation_name = await parse_graphql_request(request)
    return principal, query, variables, operation_name


def static_graphql_endpoint(schema: strawberry.Schema, *, development: bool) -> Endpoint:
    """An endpoint serving one fixed schema to authenticated callers (/metadata)."""

    async def endpoint(request: Request) -> Response:
        if request.method == "GET":
            return _playground(request, development)
        try:
            principal, query, variables, operation_name = await _authenticated(request)
        except ServiceError as exc:
            return error_response(exc)
        context = GraphQLContext(request, gateway_state(request), principal)
        result = await _execute(schema, context, query, variables, operation_name)
        return _respond(context, result, query)

    return endpoint


class WorkspaceSchemas:
    """Builds (once per data model fingerprint) the schema a workspace is served with."""

    def __init__(self, parts: Sequence[SchemaPart], static: StaticNames) -> None:
        self.parts = tuple(parts)
        self.static = static

    def build(self, model: DataModel) -> WorkspaceGraphQL:
        return build_workspace_schema(model, self.parts, self.static)

    def for_model(self, state: GatewayState, model: DataModel) -> WorkspaceGraphQL:
        return state.models.derived(GRAPHQL_SCHEMA, model, self.build)


def workspace_graphql_endpoint(schemas: WorkspaceSchemas, *, development: bool) -> Endpoint:
    """/graphql: the caller's workspace schema (records of its objects + every static part)."""

    async def endpoint(request: Request) -> Response:
        if request.method == "GET":
            return _playground(request, development)
        state = gateway_state(request)
        try:
            principal, query, variables, operation_name = await _authenticated(request)
            model = await state.models.get(principal)
        except ServiceError as exc:
            return error_response(exc)
        built = schemas.for_model(state, model)
        context = GraphQLContext(request, state, principal, model=model)
        result = await _execute(built.schema, context, query, variables, operation_name)
        if _rejected_before_execution(result):
            try:
                fresh = await state.models.refresh(principal)
            except ServiceError:
                fresh = model
            if fresh.fingerprint != model.fingerprint:
                built = schemas.for_model(state, fresh)
                context = GraphQLContext(request, state, principal, model=fresh)
                result = await _execute(built.schema, context, query, variables, operation_name)
        return _respond(context, result, query)

    return endpoint

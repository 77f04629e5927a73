"""POST /graphql and /metadata: authenticate, pick the schema, execute, answer errors in the
spec's shape. GET serves the GraphiQL playground in development only. Before anything runs,
the request is held to the GraphQL limits and counted against the rate limit (_admitted).

/graphql runs against the caller's workspace schema (generated from its data model, cached per
content fingerprint). A request the cached schema rejects as invalid (an unknown field, type or
argument: perhaps a custom object created a moment ago through another gateway) re-checks the
data model once and, when it changed, runs against the new schema; nothing was executed before,
so the retry is safe for mutations too.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
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
from gateway.graphql.documents import DocumentCache
from gateway.graphql.errors import format_graphql_error, parse_quietly
from gateway.graphql.limits import QueryAnalysis, QueryLimits, QueryTooLarge, check_request
from gateway.graphql.parts import SchemaPart
from gateway.graphql.schema import GatewaySchema
from gateway.ratelimit.http import admit_request
from gateway.state import GatewayState, gateway_state

Endpoint = Callable[[Request], Awaitable[Response]]
_HTTP_OPERATIONS = frozenset({OperationType.QUERY, OperationType.MUTATION})
GRAPHQL_SCHEMA = "graphql"


def graphql_response(
    result: ExecutionResult,
    query: str = "",
    status: int = 200,
    cost: dict[str, int] | None = None,
) -> Response:
    body: dict[str, Any] = {"data": result.data}
    if result.errors:
        document = parse_quietly(query) if query else None
        body["errors"] = [format_graphql_error(error, document) for error in result.errors]
    if cost is not None:
        body["extensions"] = {"cost": cost}
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


def error_response(error: ServiceError, cost: dict[str, int] | None = None) -> Response:
    """A request-level failure (bad body, credential, rate limit, a query over the limits)
    with its HTTP status."""
    body: dict[str, Any] = {
        "data": None,
        "errors": [{"message": error.message, "extensions": graphql_extensions(error)}],
    }
    if cost is not None:
        body["extensions"] = {"cost": cost}
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


def _respond(
    context: GraphQLContext, result: ExecutionResult, query: str, analysis: QueryAnalysis | None
) -> Response:
    limits = QueryLimits.of(context.state.settings)
    cost = analysis.cost_extension(limits) if analysis is not None else None
    response = graphql_response(result, query, cost=cost)
    response.headers.update(context.response_headers)
    return response


def _refused(error: ServiceError, request: Request) -> Response:
    analysis = error.analysis if isinstance(error, QueryTooLarge) else None
    limits = QueryLimits.of(gateway_state(request).settings)
    return error_response(error, analysis.cost_extension(limits) if analysis else None)


def _playground(request: Request, development: bool) -> Response:
    if development:
        return HTMLResponse(get_graphql_ide_html())
    raise NotFound("the GraphQL playground is served only in development")


# The schema a caller's request runs against, and the data model it was built from (/graphql).
SchemaOf = Callable[[common_pb2.Principal], Awaitable[tuple[strawberry.Schema, DataModel | None]]]


@dataclass(frozen=True)
class _Admitted:
    principal: common_pb2.Principal
    schema: strawberry.Schema
    model: DataModel | None
    query: str
    variables: dict[str, Any] | None
    operation_name: str | None
    analysis: QueryAnalysis | None


async def _admitted(request: Request, schema_of: SchemaOf) -> _Admitted:
    """The caller and its request, checked against the limits (docs/api.md, Query cost) and
    counted against the rate limit: one call, or one per top-level field of a mutation. A
    request refused before it runs (bad body, over a limit) counts as one call."""
    principal = await authenticate(request, admit=False)
    try:
        query, variables, operation_name = await parse_graphql_request(request)
        schema, model = await schema_of(principal)
        analysis = _analyse(request, schema, query, variables, operation_name)
    except ServiceError:
        await admit_request(request, principal)
        raise
    await admit_request(request, principal, analysis.calls if analysis is not None else 1)
    return _Admitted(principal, schema, model, query, variables, operation_name, analysis)


def _analyse(
    request: Request,
    schema: strawberry.Schema,
    query: str,
    variables: dict[str, Any] | None,
    operation_name: str | None,
) -> QueryAnalysis | None:
    limits = QueryLimits.of(gateway_state(request).settings)
    if isinstance(schema, GatewaySchema):
        return schema.analyses.check(schema._schema, query, variables, operation_name, limits)
    return check_request(schema._schema, query, variables, operation_name, limits)


def static_graphql_endpoint(schema: strawberry.Schema, *, development: bool) -> Endpoint:
    """An endpoint serving one fixed schema to authenticated callers (/metadata)."""

    async def fixed(principal: common_pb2.Principal) -> tuple[strawberry.Schema, None]:
        return schema, None

    async def endpoint(request: Request) -> Response:
        if request.method == "GET":
            return _playground(request, development)
        try:
            admitted = await _admitted(request, fixed)
        except ServiceError as exc:
            return _refused(exc, request)
        context = GraphQLContext(request, gateway_state(request), admitted.principal)
        result = await _execute(
            schema, context, admitted.query, admitted.variables, admitted.operation_name
        )
        return _respond(context, result, admitted.query, admitted.analysis)

    return endpoint


class WorkspaceSchemas:
    """Builds (once per data model fingerprint) the schema a workspace is served with."""

    def __init__(
        self,
        parts: Sequence[SchemaPart],
        static: StaticNames,
        documents: DocumentCache | None = None,
    ) -> None:
        self.parts = tuple(parts)
        self.static = static
        self.documents = documents if documents is not None else DocumentCache()

    def build(self, model: DataModel) -> WorkspaceGraphQL:
        return build_workspace_schema(model, self.parts, self.static, self.documents)

    def for_model(self, state: GatewayState, model: DataModel) -> WorkspaceGraphQL:
        return state.models.derived(GRAPHQL_SCHEMA, model, self.build)


def workspace_graphql_endpoint(schemas: WorkspaceSchemas, *, development: bool) -> Endpoint:
    """/graphql: the caller's workspace schema (records of its objects + every static part)."""

    async def endpoint(request: Request) -> Response:
        if request.method == "GET":
            return _playground(request, development)
        state = gateway_state(request)

        async def workspace_schema(
            principal: common_pb2.Principal,
        ) -> tuple[strawberry.Schema, DataModel]:
            model = await state.models.get(principal)
            return schemas.for_model(state, model).schema, model

        try:
            admitted = await _admitted(request, workspace_schema)
        except ServiceError as exc:
            return _refused(exc, request)
        principal, query = admitted.principal, admitted.query
        variables, operation_name = admitted.variables, admitted.operation_name
        model, analysis = admitted.model, admitted.analysis
        assert model is not None
        context = GraphQLContext(request, state, principal, model=model)
        result = await _execute(admitted.schema, context, query, variables, operation_name)
        if _rejected_before_execution(result):
            try:
                fresh = await state.models.refresh(principal)
            except ServiceError:
                fresh = model
            if fresh.fingerprint != model.fingerprint:
                built = schemas.for_model(state, fresh)
                try:
                    analysis = _analyse(request, built.schema, query, variables, operation_name)
                except ServiceError as exc:
                    return _refused(exc, request)
                context = GraphQLContext(request, state, principal, model=fresh)
                result = await _execute(built.schema, context, query, variables, operation_name)
        return _respond(context, result, query, analysis)

    return endpoint

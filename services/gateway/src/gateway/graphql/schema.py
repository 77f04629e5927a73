"""Builds the static Strawberry schema from the registered parts (served on /metadata; its
names are the ones the generated workspace schemas must avoid)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

import strawberry
from graphql import GraphQLError, specified_rules
from strawberry.tools import merge_types
from strawberry.types import ExecutionContext, ExecutionResult
from strawberry.types.graphql import OperationType

from crmkit.errors import Internal, ServiceError
from gateway.graphql.direct import DirectOperations
from gateway.graphql.documents import DocumentCache
from gateway.graphql.errors import is_request_error
from gateway.graphql.execution import GatewayExecutionContext
from gateway.graphql.limits import Analyses
from gateway.graphql.parts import SchemaPart
from gateway.graphql.scalars import schema_config

log = logging.getLogger("gateway.graphql")
# The validation rules of every execution (Strawberry's ExecutionContext default).
_RULES = tuple(specified_rules)


class GatewaySchema(strawberry.Schema):
    """Logs only what went wrong on our side: a client's mistake is answered, not logged;
    executes with gateway.graphql.execution's shorter path for plain fields; takes parsed and
    validated documents from the process's DocumentCache (its own when none is given)."""

    def __init__(self, *args: Any, documents: DocumentCache | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("execution_context_class", GatewayExecutionContext)
        super().__init__(*args, **kwargs)
        self._documents = documents if documents is not None else DocumentCache()
        self._direct = DirectOperations()
        self.analyses = Analyses()  # of the GraphQL limits (gateway.graphql.endpoint)

    def _create_execution_context(
        self,
        query: str | None,
        allowed_operation_types: Iterable[OperationType],
        variable_values: dict[str, Any] | None = None,
        context_value: Any | None = None,
        root_value: Any | None = None,
        operation_name: str | None = None,
        operation_extensions: dict[str, Any] | None = None,
    ) -> ExecutionContext:
        context = super()._create_execution_context(
            query,
            allowed_operation_types,
            variable_values,
            context_value,
            root_value,
            operation_name,
            operation_extensions,
        )
        if query:
            prepared = self._documents.prepared(self._schema, query, context.validation_rules)
            if prepared is not None:  # else Strawberry parses it and reports the syntax error
                context.graphql_document = prepared[0]
                context.pre_execution_errors = list(prepared[1])  # validated already
        return context

    async def execute(
        self,
        query: str | None,
        variable_values: dict[str, Any] | None = None,
        context_value: Any | None = None,
        root_value: Any | None = None,
        operation_name: str | None = None,
        allowed_operation_types: Iterable[OperationType] | None = None,
        operation_extensions: dict[str, Any] | None = None,
    ) -> ExecutionResult:
        """A record list, get or create takes gateway.graphql.direct's path when it qualifies."""
        if self._direct_allowed(query, root_value, operation_extensions):
            assert query is not None
            result = await self._execute_direct(
                query, variable_values, context_value, operation_name, allowed_operation_types
            )
            if result is not None:
                return result
        return await super().execute(
            query,
            variable_values,
            context_value,
            root_value,
            operation_name,
            allowed_operation_types,
            operation_extensions,
        )

    def _direct_allowed(
        self, query: str | None, root_value: Any, operation_extensions: dict[str, Any] | None
    ) -> bool:
        if not query or root_value is not None or operation_extensions:
            return False
        # their hooks run only in the normal execution
        return not (self.extensions or self.directives)

    async def _execute_direct(
        self,
        query: str,
        variable_values: dict[str, Any] | None,
        context_value: Any,
        operation_name: str | None,
        allowed_operation_types: Iterable[OperationType] | None,
    ) -> ExecutionResult | None:
        prepared = self._documents.prepared(self._schema, query, _RULES)
        if prepared is None or prepared[1]:
            return None  # does not parse or is invalid: the normal execution reports it
        direct = self._direct.find(self, prepared[0], query, operation_name, variable_values)
        if direct is None:
            return None
        allowed = allowed_operation_types
        if allowed is not None and OperationType(direct.operation.operation.value) not in allowed:
            return None  # the normal execution refuses it (a mutation sent with GET)
        result = await direct.run(self._schema, context_value, variable_values)
        if result is not None and result.errors:
            self.process_errors(result.errors)
        return result

    def process_errors(
        self, errors: list[GraphQLError], execution_context: ExecutionContext | None = None
    ) -> None:
        for error in errors:
            original = error.original_error
            if is_request_error(error):
                continue
            if isinstance(original, ServiceError) and not isinstance(original, Internal):
                continue
            log.error("GraphQL resolver failed: %s", error.message, exc_info=original)


def build_static_schema(
    parts: Sequence[SchemaPart],
    *,
    metadata_only: bool = False,
    documents: DocumentCache | None = None,
) -> strawberry.Schema:
    chosen = [part for part in parts if part.metadata or not metadata_only]
    queries = tuple(part.query for part in chosen if part.query is not None)
    mutations = tuple(part.mutation for part in chosen if part.mutation is not None)
    subscriptions = tuple(part.subscription for part in chosen if part.subscription is not None)
    return GatewaySchema(
        query=merge_types("Query", queries),
        mutation=merge_types("Mutation", mutations) if mutations else None,
        subscription=merge_types("Subscription", subscriptions) if subscriptions else None,
        config=schema_config(),
        documents=documents,
    )

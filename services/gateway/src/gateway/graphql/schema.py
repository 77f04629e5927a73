"""Builds the static Strawberry schema from the registered parts (served on /metadata; its
names are the ones the generated workspace schemas must avoid)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import strawberry
from graphql import GraphQLError
from strawberry.extensions import ParserCache, SchemaExtension, ValidationCache
from strawberry.tools import merge_types
from strawberry.types import ExecutionContext

from crmkit.errors import Internal, ServiceError
from gateway.graphql.errors import is_request_error
from gateway.graphql.execution import GatewayExecutionContext
from gateway.graphql.parts import SchemaPart
from gateway.graphql.scalars import schema_config

log = logging.getLogger("gateway.graphql")

# Clients send the same few query texts over and over: their parsed documents and validation
# results are kept (bounded LRU, shared by every schema; validation is keyed by schema too).
DOCUMENT_CACHE_SIZE = 512


def schema_extensions() -> list[Callable[[], SchemaExtension]]:
    return [
        lambda: ParserCache(maxsize=DOCUMENT_CACHE_SIZE),
        lambda: ValidationCache(maxsize=DOCUMENT_CACHE_SIZE),
    ]


class GatewaySchema(strawberry.Schema):
    """Logs only what went wrong on our side: a client's mistake is answered, not logged;
    executes with gateway.graphql.execution's shorter path for plain scalar fields."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("execution_context_class", GatewayExecutionContext)
        super().__init__(*args, **kwargs)

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
    parts: Sequence[SchemaPart], *, metadata_only: bool = False
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
        extensions=schema_extensions(),
    )

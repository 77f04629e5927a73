"""The limits a GraphQL request must fit before any resolver runs (docs/api.md, Query cost).

The document is parsed with a token limit, then one pass over the chosen operation (fragments
expanded) counts its depth, aliases and top-level fields and estimates its cost, as GitHub's
node limit does:

    cost = (top-level fields that are not connections)
         + the sum over connections of: its page * the pages of the connections around it

A connection is a field taking `first`, `last` or `limit`; its page is the largest of those
given (literals or variables, capped at the API's maximum page size), else its default page.
Scalars, and objects reached without a connection, are free. Over any limit the request is
refused (InvalidArgument, naming the limit) and nothing runs. A mutation counts as one call
against the rate limit per top-level field.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from graphql import (
    DocumentNode,
    FieldNode,
    FragmentDefinitionNode,
    FragmentSpreadNode,
    GraphQLField,
    GraphQLInterfaceType,
    GraphQLObjectType,
    GraphQLSchema,
    InlineFragmentNode,
    IntValueNode,
    OperationDefinitionNode,
    OperationType,
    SelectionSetNode,
    VariableNode,
    get_named_type,
    parse,
)
from graphql.error import GraphQLSyntaxError

from crmkit.errors import InvalidArgument
from gateway.graphql.records import RELATED_PAGE_SIZE
from gateway.pagination import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE
from gateway.settings import GatewaySettings

_PAGE_ARGUMENTS = ("first", "last", "limit")
_DOCUMENT_CACHE_SIZE = 512
ANALYSES_PER_SCHEMA = 128


@dataclass(frozen=True)
class QueryLimits:
    max_depth: int
    max_aliases: int
    max_root_fields: int
    max_tokens: int
    max_cost: int

    @classmethod
    def of(cls, settings: GatewaySettings) -> QueryLimits:
        return cls(
            max_depth=settings.GRAPHQL_MAX_DEPTH,
            max_aliases=settings.GRAPHQL_MAX_ALIASES,
            max_root_fields=settings.GRAPHQL_MAX_ROOT_FIELDS,
            max_tokens=settings.GRAPHQL_MAX_TOKENS,
            max_cost=settings.GRAPHQL_MAX_COST,
        )


@dataclass(frozen=True)
class QueryAnalysis:
    cost: int
    depth: int
    aliases: int
    root_fields: int
    calls: int  # what the request counts against the rate limit

    def cost_extension(self, limits: QueryLimits) -> dict[str, int]:
        """`extensions.cost` of the response."""
        return {"requestedQueryCost": self.cost, "maximumQueryCost": limits.max_cost}


class QueryTooLarge(InvalidArgument):
    """A request over one of the limits; carries the analysis when it got that far."""

    def __init__(self, message: str, analysis: QueryAnalysis | None = None) -> None:
        super().__init__(message)
        self.analysis = analysis


@lru_cache(maxsize=_DOCUMENT_CACHE_SIZE)
def _parse(query: str, max_tokens: int) -> DocumentNode:
    return parse(query, max_tokens=max_tokens)


def parse_limited(query: str, limits: QueryLimits) -> DocumentNode | None:
    """The parsed document; None when it does not parse (execution reports the syntax error).
    QueryTooLarge when it has more tokens than allowed."""
    try:
        return _parse(query, limits.max_tokens)
    except GraphQLSyntaxError as exc:
        if "tokens" in exc.message and "Parsing aborted" in exc.message:
            raise QueryTooLarge(
                f"the query has more than {limits.max_tokens} tokens, the maximum per request"
            ) from None
        return None


def check_request(
    schema: GraphQLSchema,
    query: str,
    variables: Mapping[str, Any] | None,
    operation_name: str | None,
    limits: QueryLimits,
) -> QueryAnalysis | None:
    """The request's analysis, or QueryTooLarge. None when there is nothing to analyse (the
    query does not parse or names no operation): execution then reports that error."""
    checked = _checked(schema, query, variables, operation_name, limits)
    return None if checked is None else checked[0]


def _checked(
    schema: GraphQLSchema,
    query: str,
    variables: Mapping[str, Any] | None,
    operation_name: str | None,
    limits: QueryLimits,
) -> tuple[QueryAnalysis, bool] | None:
    """check_request's answer, and whether a variable's value went into it (a page size)."""
    document = parse_limited(query, limits)
    if document is None:
        return None
    operation = _operation(document, operation_name)
    if operation is None:
        return None
    root = _root_type(schema, operation.operation)
    if root is None:
        return None
    walk = _Walk(schema, document, operation, variables or {}, limits)
    cost = walk.selections(operation.selection_set, root, depth=1, pages=1, at_root=True)
    calls = walk.root_fields if operation.operation is OperationType.MUTATION else 1
    analysis = QueryAnalysis(
        cost=cost,
        depth=walk.depth,
        aliases=walk.aliases,
        root_fields=walk.root_fields,
        calls=max(1, calls),
    )
    if cost > limits.max_cost:
        raise QueryTooLarge(
            f"the query's cost is {cost}, over the maximum of {limits.max_cost} per request "
            "(each connection costs its page size times the pages of the connections around "
            "it; ask for smaller pages or fewer connections)",
            analysis,
        )
    return analysis, walk.read_variables


class Analyses:
    """The analyses of one schema's operations that read no variable (none declared, or none
    giving a page size, as a mutation's `data: $d`), by query text, operation name and limits:
    they are the same on every request (check_request's answer, without its walk). Bounded; a
    request over a limit is not kept (it raises every time)."""

    def __init__(self, maxsize: int = ANALYSES_PER_SCHEMA) -> None:
        self._maxsize = maxsize
        self._entries: OrderedDict[tuple[str, str | None, QueryLimits], QueryAnalysis] = (
            OrderedDict()
        )

    def check(
        self,
        schema: GraphQLSchema,
        query: str,
        variables: Mapping[str, Any] | None,
        operation_name: str | None,
        limits: QueryLimits,
    ) -> QueryAnalysis | None:
        key = (query, operation_name, limits)
        found = self._entries.get(key)
        if found is not None:
            self._entries.move_to_end(key)
            return found
        checked = _checked(schema, query, variables, operation_name, limits)
        if checked is None:
            return None
        analysis, read_variables = checked
        if not read_variables:
            self._entries[key] = analysis
            if len(self._entries) > self._maxsize:
                self._entries.popitem(last=False)
        return analysis


def _operation(
    document: DocumentNode, operation_name: str | None
) -> OperationDefinitionNode | None:
    operations = [d for d in document.definitions if isinstance(d, OperationDefinitionNode)]
    if operation_name is None:
        return operations[0] if len(operations) == 1 else None
    for operation in operations:
        if operation.name is not None and operation.name.value == operation_name:
            return operation
    return None


def _root_type(schema: GraphQLSchema, kind: OperationType) -> GraphQLObjectType | None:
    if kind is OperationType.QUERY:
        return schema.query_type
    if kind is OperationType.MUTATION:
        return schema.mutation_type
    return schema.subscription_type


@dataclass
class _Walk:
    schema: GraphQLSchema
    document: DocumentNode
    operation: OperationDefinitionNode
    variables: Mapping[str, Any]
    limits: QueryLimits
    depth: int = 0
    aliases: int = 0
    root_fields: int = 0
    visited: int = 0
    read_variables: bool = False  # a variable's value (a page size) went into the analysis
    fragments: dict[str, FragmentDefinitionNode] = field(default_factory=dict)
    expanding: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.fragments = {
            d.name.value: d
            for d in self.document.definitions
            if isinstance(d, FragmentDefinitionNode)
        }

    def selections(
        self, selection_set: SelectionSetNode, parent: Any, *, depth: int, pages: int, at_root: bool
    ) -> int:
        cost = 0
        for selection in selection_set.selections:
            self._visit()
            if isinstance(selection, FieldNode):
                cost += self._field(selection, parent, depth=depth, pages=pages, at_root=at_root)
            elif isinstance(selection, InlineFragmentNode):
                condition = selection.type_condition
                inner = self.schema.get_type(condition.name.value) if condition else parent
                cost += self.selections(
                    selection.selection_set, inner, depth=depth, pages=pages, at_root=at_root
                )
            elif isinstance(selection, FragmentSpreadNode):
                name = selection.name.value
                fragment = self.fragments.get(name)
                if fragment is None or name in self.expanding:
                    continue  # unknown or cyclic: validation refuses the document
                self.expanding.add(name)
                inner = self.schema.get_type(fragment.type_condition.name.value)
                cost += self.selections(
                    fragment.selection_set, inner, depth=depth, pages=pages, at_root=at_root
                )
                self.expanding.discard(name)
        return cost

    def _field(self, node: FieldNode, parent: Any, *, depth: int, pages: int, at_root: bool) -> int:
        limits = self.limits
        if depth > limits.max_depth:
            raise QueryTooLarge(
                f"the query is nested deeper than {limits.max_depth} levels, the maximum "
                "per request"
            )
        self.depth = max(self.depth, depth)
        if node.alias is not None:
            self.aliases += 1
            if self.aliases > limits.max_aliases:
                raise QueryTooLarge(
                    f"the query has more than {limits.max_aliases} aliases, the maximum per request"
                )
        if at_root and node.name.value != "__typename":
            self.root_fields += 1
            if self.root_fields > limits.max_root_fields:
                raise QueryTooLarge(
                    f"the query has more than {limits.max_root_fields} top-level fields, the "
                    "maximum per request"
                )
        definition = _field_definition(parent, node.name.value)
        page = self._page(node, definition, at_root)
        inner_pages = pages if page is None else pages * page
        cost = inner_pages if page is not None else (1 if at_root else 0)
        if node.selection_set is not None:
            inner = get_named_type(definition.type) if definition is not None else None
            cost += self.selections(
                node.selection_set, inner, depth=depth + 1, pages=inner_pages, at_root=False
            )
        return cost

    def _page(self, node: FieldNode, definition: GraphQLField | None, at_root: bool) -> int | None:
        """The most records the field may return, or None when it is not a connection."""
        if definition is None or not any(name in definition.args for name in _PAGE_ARGUMENTS):
            return None
        given = [
            value
            for argument in node.arguments or ()
            if argument.name.value in _PAGE_ARGUMENTS
            and (value := self._int(argument.value)) is not None
        ]
        if not given:
            return DEFAULT_PAGE_SIZE if at_root else max(DEFAULT_PAGE_SIZE, RELATED_PAGE_SIZE)
        return min(max(max(given), 0), MAX_PAGE_SIZE)

    def _int(self, value: Any) -> int | None:
        if isinstance(value, IntValueNode):
            return int(value.value)
        if isinstance(value, VariableNode):
            self.read_variables = True
            name = value.name.value
            given = self.variables.get(name)
            if isinstance(given, int) and not isinstance(given, bool):
                return given
            for definition in self.operation.variable_definitions or ():
                if definition.variable.name.value == name and isinstance(
                    definition.default_value, IntValueNode
                ):
                    return int(definition.default_value.value)
        return None

    def _visit(self) -> None:
        # Fragments may expand a short document into very many selections: bounded like tokens.
        self.visited += 1
        if self.visited > self.limits.max_tokens:
            raise QueryTooLarge(
                f"the query expands to more than {self.limits.max_tokens} selections, the "
                "maximum per request"
            )


def _field_definition(parent: Any, name: str) -> GraphQLField | None:
    if isinstance(parent, GraphQLObjectType | GraphQLInterfaceType):
        found: GraphQLField | None = parent.fields.get(name)
        return found
    return None

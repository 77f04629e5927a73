"""A direct path for the common record operations: one root field that lists (`people(...)`),
gets (`person(id: ...)`), creates (`createPerson(data: ...)`), updates, deletes or restores
(`updatePerson(id: ..., data: ...)`, `deletePerson(id: ...)`, `restorePerson(id: ...)`) a record
of an object, with a plain selection below it.

Such an operation is compiled once per schema, query text and operation name: its root field's
resolver (RecordOperations.page, .get_one, .create, .update, .delete or .restore), what it
selects (RecordOperations.Selected, which the resolver otherwise reads from
`Info.selected_fields` on every request), its arguments converted by Strawberry's own
`convert_arguments` (once, when they are literals; per request, from the coerced variables,
otherwise), for a list with literal arguments its records request too (filter and order parsed
once; only the caller's object ref is added per request), and the plan of its selection set
(gateway.graphql.execution). A request then costs
the resolver's one call and the plan's run, without Strawberry's and graphql-core's execution
machinery around them.

The path is taken only when the document is valid, selects exactly one root field, of a record
list or get (a query) or a one-record write (a mutation) generated for the workspace, without
fragment variables or directives other than @include/@skip with literal conditions, the
selection set below it is plain, and the schema has no extensions. Anything else, variables that
do not coerce, arguments Strawberry cannot convert, and a page the plan cannot answer as
graphql-core would (a null in a non-null field, a value a scalar refuses) go through the normal
execution, which reports the same errors as always (the last case asks the records service
again: a read, and only on a broken record; a write is not sent again: the normal execution
completes the record it wrote, through `GraphQLContext.written`). A write with an
Idempotency-Key header takes the normal path, which guards it.
An error the resolver raises (a page size out of range, a filter refused, an error of the
records call) is answered as graphql-core does: located at the field with its path, the field
nulled, and the whole data when the field is non-null
(docs/decisions.md, GraphQL direct path for record queries and writes).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from graphql import (
    DirectiveNode,
    DocumentNode,
    FieldNode,
    FragmentDefinitionNode,
    GraphQLError,
    GraphQLField,
    GraphQLSchema,
    Node,
    OperationDefinitionNode,
    OperationType,
    VariableNode,
    get_operation_ast,
    located_error,
)
from graphql.execution.collect_fields import collect_fields
from graphql.execution.values import get_argument_values, get_variable_values
from strawberry.schema.schema_converter import GraphQLCoreConverter
from strawberry.types import ExecutionResult
from strawberry.types.arguments import convert_arguments
from strawberry.types.nodes import convert_selections

from crm.records.v1 import records_pb2
from gateway import idempotency
from gateway.graphql.execution import NOT_PLAIN, GatewayExecutionContext, Plan, run_plan
from gateway.graphql.records import RecordOperations, Selected

DIRECT_CACHE_SIZE = 128  # operations per schema
_LITERAL_DIRECTIVES = frozenset({"include", "skip"})
_MAX_COERCION_ERRORS = 50  # graphql-core's default, as the normal execution uses
_NOT_DIRECT = object()

# Converts graphql-core's coerced arguments to the resolver's keyword arguments.
ConvertArguments = Callable[[dict[str, Any]], dict[str, Any]]
# What the root field does, and the RecordOperations method the direct path calls for it.
LIST, GET, CREATE, UPDATE, DELETE, RESTORE = "list", "get", "create", "update", "delete", "restore"
_READS = frozenset({LIST, GET})
_RECORD_DATA_WRITES = frozenset({CREATE, UPDATE})  # arguments `data` (and `id`), as coerced
_CALLS: dict[str, Callable[..., Awaitable[Any]]] = {
    LIST: RecordOperations.page,
    GET: RecordOperations.get_one,
    CREATE: RecordOperations.create,
    UPDATE: RecordOperations.update,
    DELETE: RecordOperations.delete,
    RESTORE: RecordOperations.restore,
}


@dataclass(frozen=True, slots=True)
class DirectOperation:
    """How one compiled operation is answered."""

    key: str  # the root field's response key
    nodes: tuple[FieldNode, ...]  # the root field's nodes (errors are located at them)
    field_def: GraphQLField
    non_null: bool
    operations: RecordOperations
    kind: str  # LIST, GET, CREATE, UPDATE, DELETE or RESTORE
    selected: Selected
    plan: Plan
    operation: OperationDefinitionNode
    convert: ConvertArguments
    arguments: dict[str, Any] | None  # converted once when the arguments are literals
    # A list's records request, made once when its arguments are literals and accepted.
    prepared: records_pb2.ListRecordsRequest | None = None

    def arguments_for(
        self, schema: GraphQLSchema, variables: dict[str, Any] | None
    ) -> dict[str, Any] | None:
        """The resolver's keyword arguments; None when the variables do not coerce."""
        if self.arguments is not None:
            return self.arguments
        coerced = get_variable_values(
            schema,
            self.operation.variable_definitions or (),
            variables or {},
            max_errors=_MAX_COERCION_ERRORS,
        )
        if isinstance(coerced, list):
            return None
        return self.convert(get_argument_values(self.field_def, self.nodes[0], coerced))

    async def run(
        self, schema: GraphQLSchema, context: Any, variables: dict[str, Any] | None
    ) -> ExecutionResult | None:
        """The answer; None when the normal execution must answer (the variables or arguments
        did not convert, or a write carries an Idempotency-Key: nothing was asked yet; or the
        answer holds a value the plan cannot complete: a written record is then left in
        `context.written` for the normal execution to complete)."""
        reads = self.kind in _READS
        if not reads and _has_idempotency_key(context):
            return None
        if self.prepared is not None:
            return await self._answer(
                context, reads, self.operations.prepared_page(context, self.prepared)
            )
        try:
            arguments = self.arguments_for(schema, variables)
        except Exception:  # the normal execution raises and reports it
            return None
        if arguments is None:
            return None
        method = _CALLS[self.kind]
        if reads:
            call = method(self.operations, context, self.selected, **arguments)
        else:
            call = method(self.operations, context, **arguments)
        return await self._answer(context, reads, call)

    async def _answer(
        self, context: Any, reads: bool, call: Awaitable[Any]
    ) -> ExecutionResult | None:
        try:
            value = await call
        except Exception as exc:
            error = located_error(exc, list(self.nodes), [self.key])
            return _result(None if self.non_null else {self.key: None}, [error])
        if value is None:
            if self.non_null:
                return None
            return _result({self.key: None}, None)
        answer = run_plan(self.plan, value)
        if answer is NOT_PLAIN:
            if not reads:
                context.written[self.key] = value
            return None
        return _result({self.key: answer}, None)


def _has_idempotency_key(context: Any) -> bool:
    headers = getattr(context.connection, "headers", None)
    return headers is not None and idempotency.HEADER in headers


def _result(data: dict[str, Any] | None, errors: list[GraphQLError] | None) -> ExecutionResult:
    # `extensions` as Strawberry's execute answers it when the schema has no extensions
    return ExecutionResult(data=data, errors=errors, extensions={})


class DirectOperations:
    """The compiled operations of one schema, by query text and operation name (bounded)."""

    def __init__(self, maxsize: int = DIRECT_CACHE_SIZE) -> None:
        self._maxsize = maxsize
        self._entries: OrderedDict[tuple[str, str | None], Any] = OrderedDict()

    def find(
        self,
        schema: Any,
        document: DocumentNode,
        query: str,
        operation_name: str | None,
        variables: dict[str, Any] | None,
    ) -> DirectOperation | None:
        key = (query, operation_name)
        entry = self._entries.get(key)
        if entry is None:
            compiled = compile_operation(schema, document, operation_name, variables)
            if compiled is None:
                return None  # the variables did not coerce: perhaps the next request's will
            entry = self._entries[key] = compiled
            if len(self._entries) > self._maxsize:
                self._entries.popitem(last=False)
        else:
            self._entries.move_to_end(key)
        return entry if isinstance(entry, DirectOperation) else None


def compile_operation(
    schema: Any,
    document: DocumentNode,
    operation_name: str | None,
    variables: dict[str, Any] | None,
) -> DirectOperation | object | None:
    """The direct operation of a valid document, _NOT_DIRECT when it does not qualify, None
    when `variables` do not coerce (undecided)."""
    operation = get_operation_ast(document, operation_name)
    if operation is None or operation.operation is OperationType.SUBSCRIPTION:
        return _NOT_DIRECT
    if not _literal_directives(document):
        return _NOT_DIRECT
    graphql_schema: GraphQLSchema = schema._schema
    executor = GatewayExecutionContext.build(
        graphql_schema, document, raw_variable_values=variables, operation_name=operation_name
    )
    if not isinstance(executor, GatewayExecutionContext):
        return None  # the variables do not coerce
    is_query = operation.operation is OperationType.QUERY
    root_type = graphql_schema.query_type if is_query else graphql_schema.mutation_type
    if root_type is None:
        return _NOT_DIRECT
    grouped, defer_usages, _ = collect_fields(
        graphql_schema, executor.fragments, executor.variable_values, root_type, operation
    )
    if defer_usages or len(grouped) != 1:
        return _NOT_DIRECT
    [(key, details)] = grouped.items()
    if any(detail.fragment_variable_values is not None for detail in details):
        return _NOT_DIRECT
    nodes = tuple(detail.node for detail in details)
    field_def = root_type.fields.get(nodes[0].name.value)
    if field_def is None:
        return _NOT_DIRECT
    resolver = _record_resolver(field_def)
    if resolver is None:
        return _NOT_DIRECT
    operations, kind, strawberry_field = resolver
    if (kind in _READS) != is_query:
        return _NOT_DIRECT
    planned = executor.object_field_plan(field_def, details)
    if planned is None:
        return _NOT_DIRECT
    non_null, plan = planned
    fragments = {
        definition.name.value: definition
        for definition in document.definitions
        if isinstance(definition, FragmentDefinitionNode)
    }
    # Strawberry's `Info.selected_fields` of the field, from the same nodes (names only).
    info = SimpleNamespace(fragments=fragments, variable_values={})
    selected = Selected.of(convert_selections(info, nodes))  # type: ignore[arg-type]

    def convert(values: dict[str, Any]) -> dict[str, Any]:
        return convert_arguments(
            values,
            strawberry_field.arguments,
            scalar_registry=schema.schema_converter.scalar_registry,
            config=schema.config,
        )

    if kind in _RECORD_DATA_WRITES and set(field_def.args) == {
        argument.python_name for argument in strawberry_field.arguments
    }:
        # The write hands `data` to `record_json`, which makes the same JSON of graphql-core's
        # coerced input (a dict keyed by GraphQL name, unset fields absent, enums and scalars
        # already parsed) as of the Strawberry input object it would become: the conversion,
        # a fifth of a GraphQL create's gateway CPU, is skipped.
        convert = _as_coerced

    arguments = None
    prepared = None
    if not operation.variable_definitions:
        try:
            arguments = convert(get_argument_values(field_def, nodes[0], None))
        except Exception:  # the normal execution raises and reports it
            return _NOT_DIRECT
        if kind == LIST:
            prepared = _prepared_list(operations, selected, arguments)
    return DirectOperation(
        key=key,
        nodes=nodes,
        field_def=field_def,
        non_null=non_null,
        operations=operations,
        kind=kind,
        selected=selected,
        plan=plan,
        operation=operation,
        convert=convert,
        arguments=arguments,
        prepared=prepared,
    )


def _as_coerced(values: dict[str, Any]) -> dict[str, Any]:
    return values


def _prepared_list(
    operations: RecordOperations, selected: Selected, arguments: dict[str, Any]
) -> records_pb2.ListRecordsRequest | None:
    """The records request of a list whose arguments are literals; None when they are refused
    (each request then reports it)."""
    try:
        return operations.list_request(selected, **arguments)
    except Exception:
        return None


def _record_resolver(field_def: GraphQLField) -> tuple[RecordOperations, str, Any] | None:
    """The RecordOperations behind a generated list, get or one-record write field, which of
    them it is, and the Strawberry field; None for any other field, or one with extensions or
    permissions."""
    strawberry_field = (field_def.extensions or {}).get(GraphQLCoreConverter.DEFINITION_BACKREF)
    if strawberry_field is None or strawberry_field.extensions:
        return None
    if strawberry_field.permission_classes or strawberry_field.directives:
        return None
    base = strawberry_field.base_resolver
    implementation = getattr(getattr(base, "wrapped_func", None), "implementation", None)
    owner = getattr(implementation, "__self__", None)
    if not isinstance(owner, RecordOperations):
        return None
    function = getattr(implementation, "__func__", None)
    kind = _KINDS.get(function)
    return None if kind is None else (owner, kind, strawberry_field)


_KINDS: dict[Any, str] = {
    RecordOperations.list_page: LIST,
    RecordOperations.get: GET,
    RecordOperations.create_one: CREATE,
    RecordOperations.update_one: UPDATE,
    RecordOperations.delete_one: DELETE,
    RecordOperations.restore_one: RESTORE,
}


def _literal_directives(document: DocumentNode) -> bool:
    """Every directive of the document is @include or @skip with a literal condition (so the
    selection does not depend on the variables), and no fragment declares variables."""
    stack: list[Node] = list(document.definitions)
    while stack:
        node = stack.pop()
        if isinstance(node, FragmentDefinitionNode) and node.variable_definitions:
            return False
        for directive in getattr(node, "directives", None) or ():
            if not _literal_directive(directive):
                return False
        selection_set = getattr(node, "selection_set", None)
        if selection_set is not None:
            stack.extend(selection_set.selections)
    return True


def _literal_directive(directive: DirectiveNode) -> bool:
    if directive.name.value not in _LITERAL_DIRECTIVES:
        return False
    return not any(
        isinstance(argument.value, VariableNode) for argument in directive.arguments or ()
    )


__all__ = ["DirectOperation", "DirectOperations", "compile_operation"]

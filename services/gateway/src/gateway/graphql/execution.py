"""The executor of every gateway schema: graphql-core's (through Strawberry's), with a shorter
path for the parts of an answer that are plain data.

A record's scalar fields (a list of 20 people selecting 10 fields is 200 of them) are "basic"
Strawberry fields: no resolver of their own, no arguments, no extensions; their value is the
record's key. graphql-core still builds a path, a resolve info and a completion per field, and a
completion per object and list item. Here a selection set whose every field is plain is compiled
once per request into a plan (fields read with their own default resolver, scalars coerced by
their own type, objects and lists of objects below them compiled the same way, `__typename`
answered by the type), and each object of that shape is answered by running the plan: a page's
connection, its edges and their nodes in one pass. A many-to-one relation (`company` of a person)
is plain too where its field is marked NESTED_RELATION: the plan reads the related record the
records service nested in the parent (asked for depth 1), or answers null when the parent has no
foreign key, as `records.resolve_many_to_one` does; a related record that was not nested (its
resolver would load it) makes the object not plain. A field of a mixed object is still answered
directly when it is a plain scalar. Anything else (a one-to-many relation, a field with arguments
or with a directive other than @include/@skip, an abstract type, a type with `is_type_of`, nested
lists, field middleware) takes graphql-core's own path, and so does any object where a plan meets
a value it cannot answer as graphql-core would (a null in a non-null field, a value a scalar
refuses, an error or awaitable as a value): graphql-core then completes that object again
from its source, and reports the errors (docs/decisions.md, GraphQL execution of plain fields).
gateway.graphql.direct runs the same plans (`run_plan`) without graphql-core for the common
record list or get.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from graphql import (
    GraphQLEnumType,
    GraphQLList,
    GraphQLNonNull,
    GraphQLObjectType,
    GraphQLScalarType,
)
from graphql.pyutils import Undefined
from strawberry.schema.schema import StrawberryGraphQLCoreExecutionContext
from strawberry.schema.schema_converter import GraphQLCoreConverter

from gateway.graphql.scalars import STR_OUTPUT_AS_IS, resolve_attribute

_LEAF_TYPES = (GraphQLScalarType, GraphQLEnumType)
# Values of these types are neither errors nor awaitables (what graphql-core checks a value for).
_DATA_TYPES = frozenset({str, int, float, bool, dict, list})
NOT_PLAIN = object()  # the field or object needs graphql-core's own path
_SELECTION_DIRECTIVES = frozenset({"include", "skip"})  # already applied when fields are collected
_BASIC_RESOLVER = "_get_basic_result"  # Strawberry's resolver of a basic field
# The key of a many-to-one relation field's Strawberry metadata: (the key of the related record
# nested in the parent, the key of the parent's foreign key); set by gateway.graphql.builder.
NESTED_RELATION = "crm.nested_relation"


@dataclass(frozen=True, slots=True)
class _Field:
    """How one response key of a plain selection set is answered."""

    key: str
    resolve: Callable[..., Any] | None  # None: `__typename`
    # The dict key the resolver reads (scalars.resolve_attribute) when the source is a dict.
    item: str | None
    typename: str
    non_null: bool
    is_list: bool
    item_non_null: bool
    coerce: Callable[[Any], Any] | None  # a scalar's (or list of scalars'); None: an object
    plan: tuple[_Field, ...] | None  # the object's (or list items') selection set
    # A nested many-to-one relation (`resolve` is None, `item` the nested record's key): the
    # parent's foreign key, whose value without a nested record means the resolver must load it.
    foreign_key: str | None = None
    # A scalar whose coercion answers a str as it is: a str value is taken without calling it.
    str_as_is: bool = False


Plan = tuple[_Field, ...]


def _dict_key(field_def: Any) -> str | None:
    """The key a basic field's resolver reads from a dict source: its Python name, when it
    resolves with scalars.resolve_attribute (every gateway schema's default resolver)."""
    strawberry_field = (field_def.extensions or {}).get(GraphQLCoreConverter.DEFINITION_BACKREF)
    if getattr(strawberry_field, "default_resolver", None) is not resolve_attribute:
        return None
    name = getattr(strawberry_field, "python_name", None)
    return name if isinstance(name, str) else None


def _basic_resolver(parent_type: GraphQLObjectType, name: str) -> Any:
    field_def = parent_type.fields.get(name)
    if field_def is None:
        return None
    resolve = field_def.resolve
    if resolve is None or not getattr(resolve, "_is_default", False):
        return None
    if getattr(resolve, "__name__", "") != _BASIC_RESOLVER:
        return None  # a field with extensions: they need a resolve info
    return field_def


def _nested_relation(field_def: Any) -> tuple[str, str] | None:
    """The nested record's key and the foreign key of a many-to-one relation field whose value
    a plan may read from its parent (marked NESTED_RELATION, no permission classes or field
    extensions to run); None for any other field."""
    strawberry_field = (field_def.extensions or {}).get(GraphQLCoreConverter.DEFINITION_BACKREF)
    if strawberry_field is None or strawberry_field.extensions:
        return None
    if strawberry_field.permission_classes or strawberry_field.directives:
        return None
    marker = (strawberry_field.metadata or {}).get(NESTED_RELATION)
    if not isinstance(marker, tuple) or len(marker) != 2:
        return None
    nested, foreign_key = marker
    if not (isinstance(nested, str) and isinstance(foreign_key, str)):
        return None
    return nested, foreign_key


def _nested_record(field: _Field, source: Any) -> Any:
    """The related record of a nested relation field: the one nested in `source`, None where
    `source` has no foreign key (as the field's resolver answers), NOT_PLAIN where the resolver
    would load it (not nested: not asked for, or refused)."""
    if type(source) is not dict:
        return NOT_PLAIN
    nested = source.get(field.item)
    if type(nested) is dict:
        return nested
    return NOT_PLAIN if source.get(field.foreign_key) else None


def run_plan(plan: Plan, source: Any) -> Any:
    """The object `source` answered by `plan`, or NOT_PLAIN (graphql-core's path must answer
    it)."""
    result: dict[str, Any] = {}
    is_dict = type(source) is dict
    for field in plan:
        resolve = field.resolve
        if resolve is None:
            if field.foreign_key is None:
                result[field.key] = field.typename
                continue
            related = _nested_record(field, source)
            if related is NOT_PLAIN or (related is None and field.non_null):
                return NOT_PLAIN
            if related is None:
                result[field.key] = None
                continue
            assert field.plan is not None
            done = run_plan(field.plan, related)
            if done is NOT_PLAIN:
                return NOT_PLAIN
            result[field.key] = done
            continue
        if is_dict and field.item is not None:
            value = source.get(field.item)
            if field.str_as_is and type(value) is str:
                result[field.key] = value
                continue
        else:
            try:
                value = resolve(source, None)
            except Exception:  # graphql-core's path reports it
                return NOT_PLAIN
        if value is None:
            if field.non_null:
                return NOT_PLAIN
            result[field.key] = None
            continue
        if field.is_list:
            if type(value) is not list:
                return NOT_PLAIN
            items: list[Any] = []
            for item in value:
                if item is None:
                    if field.item_non_null:
                        return NOT_PLAIN
                    items.append(None)
                    continue
                done = _complete(field, item)
                if done is NOT_PLAIN:
                    return NOT_PLAIN
                items.append(done)
            result[field.key] = items
            continue
        done = _complete(field, value)
        if done is NOT_PLAIN:
            return NOT_PLAIN
        result[field.key] = done
    return result


def _complete(field: _Field, value: Any) -> Any:
    """A non-null value of `field` (or of one of its list items) completed, or NOT_PLAIN."""
    if type(value) not in _DATA_TYPES and (
        isinstance(value, Exception) or inspect.isawaitable(value)
    ):
        return NOT_PLAIN
    coerce = field.coerce
    if coerce is None:
        assert field.plan is not None
        return run_plan(field.plan, value)
    try:
        coerced = coerce(value)
    except Exception:  # graphql-core's path reports it
        return NOT_PLAIN
    return NOT_PLAIN if coerced is None or coerced is Undefined else coerced


class GatewayExecutionContext(StrawberryGraphQLCoreExecutionContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # (parent type, selection set) -> the plan (None: not plain), for this request only;
        # the selection set is kept alive with it, as graphql-core's own memo of subfields does.
        self._plans: dict[tuple[int, int], tuple[Any, Any, Plan | None]] = {}

    # -- plans ----------------------------------------------------------------------------------

    def _plan(self, parent_type: GraphQLObjectType, grouped_field_set: Any) -> Plan | None:
        memo = (id(parent_type), id(grouped_field_set))
        known = self._plans.get(memo)
        if known is not None:
            return known[2]
        plan = self._compile(parent_type, grouped_field_set)
        self._plans[memo] = (parent_type, grouped_field_set, plan)
        return plan

    def _compile(self, parent_type: GraphQLObjectType, grouped_field_set: Any) -> Plan | None:
        fields: list[_Field] = []
        for key, details in grouped_field_set.items():
            node = details[0].node
            if node.arguments or any(
                directive.name.value not in _SELECTION_DIRECTIVES
                for directive in node.directives or ()
            ):
                return None
            name = node.name.value
            if name == "__typename":
                fields.append(
                    _Field(key, None, None, parent_type.name, True, False, False, None, None)
                )
                continue
            field_def = _basic_resolver(parent_type, name)
            if field_def is None:
                field = self._compile_relation(key, parent_type.fields.get(name), details)
                if field is None:
                    return None
                fields.append(field)
                continue
            field = self._compile_field(key, field_def, details)
            if field is None:
                return None
            fields.append(field)
        return tuple(fields)

    def _compile_field(self, key: str, field_def: Any, details: Any) -> _Field | None:
        field_type = field_def.type
        non_null = isinstance(field_type, GraphQLNonNull)
        field_type = field_type.of_type if non_null else field_type
        is_list = isinstance(field_type, GraphQLList)
        item_non_null = False
        if is_list:
            field_type = field_type.of_type
            item_non_null = isinstance(field_type, GraphQLNonNull)
            field_type = field_type.of_type if item_non_null else field_type
        resolve, item = field_def.resolve, _dict_key(field_def)
        if isinstance(field_type, _LEAF_TYPES):
            coerce = field_type.coerce_output_value
            str_as_is = not is_list and coerce in STR_OUTPUT_AS_IS
            field = _Field(key, resolve, item, "", non_null, is_list, item_non_null, coerce, None)
            return replace(field, str_as_is=True) if str_as_is else field
        if not isinstance(field_type, GraphQLObjectType) or field_type.is_type_of is not None:
            return None  # abstract types, nested lists, checked types: graphql-core's path
        grouped, defer_usages, _ = self.collect_subfields(field_type, details)
        if defer_usages:
            return None
        plan = self._plan(field_type, grouped)
        if plan is None:
            return None
        return _Field(key, resolve, item, "", non_null, is_list, item_non_null, None, plan)

    def _compile_relation(self, key: str, field_def: Any, details: Any) -> _Field | None:
        """A many-to-one relation field answered from the record nested in its parent, when
        it is marked so and the related type's selection set is plain; None otherwise."""
        relation = None if field_def is None else _nested_relation(field_def)
        if relation is None:
            return None
        nested, foreign_key = relation
        planned = self.object_field_plan(field_def, details)
        if planned is None:
            return None
        non_null, plan = planned
        return _Field(key, None, nested, "", non_null, False, False, None, plan, foreign_key)

    def object_field_plan(self, field_def: Any, details: Any) -> tuple[bool, Plan] | None:
        """Whether a field of an object type (or a non-null one) is non-null, and the plan of
        its selection set; None when the type is another or the selection is not plain."""
        field_type = field_def.type
        non_null = isinstance(field_type, GraphQLNonNull)
        named = field_type.of_type if non_null else field_type
        if not isinstance(named, GraphQLObjectType):
            return None
        plan = self.subfields_plan(named, details)
        return None if plan is None else (non_null, plan)

    def subfields_plan(
        self, return_type: GraphQLObjectType, field_details_list: Any
    ) -> Plan | None:
        """The plan of the selection set of a field of `return_type` (None: not plain)."""
        if return_type.is_type_of is not None:
            return None
        grouped, defer_usages, _ = self.collect_subfields(return_type, field_details_list)
        if defer_usages:
            return None
        return self._plan(return_type, grouped)

    # -- graphql-core's entry points ------------------------------------------------------------

    def _plain_resolvers(self) -> bool:
        middleware = self.middleware_manager
        return middleware is None or not middleware.middlewares

    def _plain_value(self, parent_type: GraphQLObjectType, source: Any, details: Any) -> Any:
        """The completed value of a basic scalar field, or NOT_PLAIN."""
        node = details[0].node
        if node.arguments:
            return NOT_PLAIN
        field_def = _basic_resolver(parent_type, node.name.value)
        if field_def is None:
            return NOT_PLAIN
        field = self._compile_field(node.name.value, field_def, details)
        if field is None or field.coerce is None or field.is_list:
            return NOT_PLAIN
        result = run_plan((field,), source)
        return NOT_PLAIN if result is NOT_PLAIN else result[field.key]

    def execute_fields(
        self,
        parent_type: GraphQLObjectType,
        source_value: Any,
        path: Any,
        grouped_field_set: Any,
        position_context: Any,
    ) -> Any:
        if self._plain_resolvers():
            plan = self._plan(parent_type, grouped_field_set)
            if plan is not None:
                result = run_plan(plan, source_value)
                if result is not NOT_PLAIN:
                    return result
        return super().execute_fields(
            parent_type, source_value, path, grouped_field_set, position_context
        )

    def execute_field(
        self,
        parent_type: GraphQLObjectType,
        source: Any,
        field_details_list: Any,
        path: Any,
        position_context: Any,
    ) -> Any:
        if self._plain_resolvers():
            value = self._plain_value(parent_type, source, field_details_list)
            if value is not NOT_PLAIN:
                return value
        return super().execute_field(
            parent_type, source, field_details_list, path, position_context
        )

"""Builds a workspace's GraphQL schema from its data model, merged with the static parts.

For each object (type name `T` from the singular name):
  types    T, TConnection, TEdge, TAggregate, TAggregateValues; enums T<Field>Enum
  inputs   TFilter, TOrderBy, TCreateInput, TUpdateInput
  query    <plural>(filter, orderBy, limit, first, after, last, before), <singular>(id),
           <singular>History(id, first, after, fields, since, until), <plural>Aggregate(filter)
  field    history(first, after) on T (unless T has a field named `history`)
  mutation create<S>, create<P>, upsert<S>, upsert<P>, update<S>, update<P>, delete<S>,
           delete<P>, restore<S>

Generated classes are created blank first and filled in a second pass, so relations refer to
each other's classes directly (cross references), then decorated; the registry keeps them by
name. A generated name that collides with a static part's is suffixed (`Record`) for types and
skipped (logged) for operations, so one unlucky object name never breaks a workspace's schema.
"""

from __future__ import annotations

import enum
import inspect
import logging
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import strawberry
from strawberry.tools import merge_types
from strawberry.types.unset import UNSET

from gateway.datamodel.model import (
    DataModel,
    FieldModel,
    FieldType,
    ObjectModel,
)
from gateway.graphql import history
from gateway.graphql.documents import DocumentCache
from gateway.graphql.execution import NESTED_RELATION
from gateway.graphql.page_info import PageInfo
from gateway.graphql.parts import GeneratedTypes, SchemaPart
from gateway.graphql.records import RecordOperations, resolve_many_to_one, resolve_one_to_many
from gateway.graphql.scalars import schema_config
from gateway.graphql.schema import GatewaySchema
from gateway.graphql.typemap import (
    GENERATED_MODULE,
    INPUT_SCALARS,
    SCALARS,
    RelationInput,
    SortDirection,
    StringMultiSelectFilter,
    StringSelectFilter,
    UUIDFilter,
    python_name,
    select_filter,
)

log = logging.getLogger("gateway.graphql")

_GRAPHQL_NAME = re.compile(r"^[_A-Za-z][_0-9A-Za-z]*$")
_NON_NULL_OUTPUT = frozenset({"id", "createdAt", "updatedAt"})
_NOT_WRITABLE = frozenset({"id", "createdAt", "updatedAt", "deletedAt"})
_TYPE_SUFFIXES = (
    "",
    "Connection",
    "Edge",
    "Filter",
    "OrderBy",
    "CreateInput",
    "UpdateInput",
    "Aggregate",
    "AggregateValues",
)

Resolver = Callable[..., Any]  # a value, or an awaitable of it


def pascal(name: str) -> str:
    return name[:1].upper() + name[1:]


@dataclass(frozen=True)
class StaticNames:
    """Names the static parts already use, which generated names must avoid."""

    types: frozenset[str]
    queries: frozenset[str]
    mutations: frozenset[str]

    @classmethod
    def of(cls, schema: strawberry.Schema) -> StaticNames:
        graphql = schema._schema
        mutation = graphql.mutation_type
        return cls(
            types=frozenset(graphql.type_map),
            queries=frozenset(graphql.query_type.fields) if graphql.query_type else frozenset(),
            mutations=frozenset(mutation.fields) if mutation else frozenset(),
        )


@dataclass
class ObjectTypes:
    """The generated classes of one object."""

    obj: ObjectModel
    name: str
    record: type
    connection: type
    edge: type
    filter: type
    order_by: type
    create_input: type
    update_input: type
    aggregate: type
    aggregate_values: type | None
    enums: dict[str, Any] = field(default_factory=dict)
    enum_filters: dict[str, type] = field(default_factory=dict)


class TypeRegistry:
    """Generated types keyed by GraphQL name, with the names the static parts hold reserved."""

    def __init__(self, reserved: frozenset[str]) -> None:
        self._reserved = set(reserved)
        self._types: dict[str, Any] = {}

    def free_base(self, base: str, suffixes: Sequence[str]) -> str:
        """`base`, or `base` + Record(N), such that every base+suffix name is free."""
        candidates = [base, f"{base}Record", *(f"{base}Record{n}" for n in range(2, 100))]
        for candidate in candidates:
            if all(not self.taken(candidate + suffix) for suffix in suffixes):
                return candidate
        raise ValueError(f"no free GraphQL type name for {base}")

    def taken(self, name: str) -> bool:
        return name in self._reserved or name in self._types

    def register(self, name: str, value: Any) -> Any:
        if self.taken(name):
            raise ValueError(f"GraphQL type name {name} is taken")
        self._types[name] = value
        return value

    def get(self, name: str) -> Any:
        """The generated type (class, enum or input) registered under `name`."""
        return self._types.get(name)


def _blank(name: str) -> type:
    return type(name, (), {"__module__": GENERATED_MODULE})


def _fill(cls: type, annotations: dict[str, Any], attributes: dict[str, Any]) -> None:
    cls.__annotations__ = annotations
    for key, value in attributes.items():
        setattr(cls, key, value)


def _resolver(
    implementation: Resolver,
    name: str,
    arguments: Sequence[tuple[str, Any, Any]],
    returns: Any,
    *,
    with_root: bool = False,
) -> Resolver:
    """A resolver Strawberry can read: an explicit signature carries the generated types.
    It is a coroutine function when `implementation` is one."""

    async def resolve_async(*args: Any, **kwargs: Any) -> Any:
        return await implementation(*args, **kwargs)

    def resolve_sync(*args: Any, **kwargs: Any) -> Any:
        return implementation(*args, **kwargs)

    resolve: Callable[..., Any] = (
        resolve_async if inspect.iscoroutinefunction(implementation) else resolve_sync
    )
    positional = inspect.Parameter.POSITIONAL_OR_KEYWORD
    parameters = [inspect.Parameter("root", positional)] if with_root else []
    parameters.append(inspect.Parameter("info", positional, annotation=strawberry.Info))
    parameters.extend(
        inspect.Parameter(
            arg, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default
        )
        for arg, annotation, default in arguments
    )
    resolve.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        parameters, return_annotation=returns
    )
    resolve.__name__ = name
    resolve.__qualname__ = name
    resolve.implementation = implementation  # type: ignore[attr-defined]  # gateway.graphql.direct
    return resolve


class SchemaBuilder:
    def __init__(self, model: DataModel, static: StaticNames) -> None:
        self.model = model
        self.static = static
        self.registry = TypeRegistry(static.types | history.TYPE_NAMES)
        self.objects: dict[str, ObjectTypes] = {}
        self.query: dict[str, Any] = {}
        self.mutation: dict[str, Any] = {}
        self.skipped: list[str] = []

    # -- pass 1: names and blank classes ----------------------------------------------------

    def declare(self) -> None:
        for obj in self.model.objects:
            base = self.registry.free_base(pascal(obj.singular), _TYPE_SUFFIXES)
            blank = {
                suffix: self.registry.register(base + suffix, _blank(base + suffix))
                for suffix in _TYPE_SUFFIXES
            }
            numeric = [f for f in obj.fields if f.type in (FieldType.NUMBER, FieldType.CURRENCY)]
            self.objects[obj.singular] = ObjectTypes(
                obj=obj,
                name=base,
                record=blank[""],
                connection=blank["Connection"],
                edge=blank["Edge"],
                filter=blank["Filter"],
                order_by=blank["OrderBy"],
                create_input=blank["CreateInput"],
                update_input=blank["UpdateInput"],
                aggregate=blank["Aggregate"],
                aggregate_values=blank["AggregateValues"] if numeric else None,
            )
            for f in obj.fields:
                if f.type in (FieldType.SELECT, FieldType.MULTI_SELECT):
                    self._declare_enum(self.objects[obj.singular], f)

    def _declare_enum(self, types: ObjectTypes, f: FieldModel) -> None:
        values = [
            v for v in f.options if _GRAPHQL_NAME.match(v) and v not in ("true", "false", "null")
        ]
        if not values or len(values) != len(f.options) or len(set(values)) != len(values):
            return  # served as String: some option is not a valid GraphQL enum value
        name = f"{types.name}{pascal(f.name)}Enum"
        if self.registry.taken(name) or self.registry.taken(name + "Filter"):
            return
        try:
            python_enum = enum.Enum(name, [(value, value) for value in values])  # type: ignore[misc]
        except (ValueError, TypeError):
            return
        graphql_enum = strawberry.enum(python_enum, name=name, description=f.label or None)
        self.registry.register(name, graphql_enum)
        types.enum_filters[f.name] = self.registry.register(
            name + "Filter", select_filter(name + "Filter", graphql_enum, f.type)
        )
        types.enums[f.name] = graphql_enum

    # -- pass 2: fields ----------------------------------------------------------------------

    def define(self) -> None:
        for types in self.objects.values():
            self._record(types)
            self._connection(types)
            self._filter(types)
            self._order_by(types)
            self._inputs(types)
            self._aggregate(types)
            self._operations(types)

    def _value_annotation(self, types: ObjectTypes, f: FieldModel, *, for_input: bool) -> Any:
        graphql_enum = types.enums.get(f.name)
        if f.type is FieldType.SELECT:
            return graphql_enum if graphql_enum is not None else str
        if f.type is FieldType.MULTI_SELECT:
            return list[graphql_enum] if graphql_enum is not None else list[str]  # type: ignore[valid-type]
        return (INPUT_SCALARS if for_input else {k: v.output for k, v in SCALARS.items()})[f.type]

    def _record(self, types: ObjectTypes) -> None:
        obj = types.obj
        annotations: dict[str, Any] = {}
        attributes: dict[str, Any] = {}
        for f in obj.fields:
            description = f.description or None
            if f.is_many_to_one:
                target = self.objects.get(f.target)
                if target is None:
                    continue
                attributes[python_name(f.name)] = strawberry.field(
                    name=f.name,
                    description=description,
                    # What resolve_many_to_one reads first, so plans read it without it.
                    metadata={NESTED_RELATION: (f.name, f.foreign_key)},
                    resolver=_resolver(
                        _many_to_one(f),
                        f"resolve_{f.name}",
                        (),
                        target.record | None,
                        with_root=True,
                    ),
                )
                if obj.field(f.foreign_key) is None:
                    self._plain_field(
                        annotations,
                        attributes,
                        f.foreign_key,
                        uuid.UUID | None,
                        f"Id of {f.name}",
                    )
                continue
            if f.is_one_to_many:
                target = self.objects.get(f.target)
                if target is None or not f.inverse:
                    continue
                attributes[python_name(f.name)] = strawberry.field(
                    name=f.name,
                    description=description,
                    resolver=_resolver(
                        _one_to_many(f, target.obj),
                        f"resolve_{f.name}",
                        (
                            ("filter", target.filter | None, UNSET),
                            ("orderBy", list[target.order_by] | None, UNSET),  # type: ignore[name-defined]
                            ("first", int | None, UNSET),
                        ),
                        target.connection,
                        with_root=True,
                    ),
                )
                continue
            value = self._value_annotation(types, f, for_input=False)
            annotation = value if f.name in _NON_NULL_OUTPUT else value | None
            self._plain_field(annotations, attributes, f.name, annotation, description)
        if obj.field(history.FIELD_NAME) is None:
            attributes[history.FIELD_NAME] = strawberry.field(
                name=history.FIELD_NAME,
                description="Changes of this record, newest first.",
                resolver=_resolver(
                    history.field_resolver(obj),
                    "resolve_history",
                    history.FIELD_ARGUMENTS,
                    history.HistoryConnection,
                    with_root=True,
                ),
            )
        _fill(types.record, annotations, attributes)

    @staticmethod
    def _plain_field(
        annotations: dict[str, Any],
        attributes: dict[str, Any],
        name: str,
        annotation: Any,
        description: str | None,
    ) -> None:
        attribute = python_name(name)
        annotations[attribute] = annotation
        if attribute == name:
            attributes[attribute] = strawberry.field(name=name, description=description)
        else:  # a Python keyword: read the record key explicitly
            attributes[attribute] = strawberry.field(
                name=name,
                description=description,
                resolver=_key_reader(name, annotation),
            )
            del annotations[attribute]

    def _connection(self, types: ObjectTypes) -> None:
        _fill(
            types.edge,
            {"node": types.record, "cursor": str},
            {
                "node": strawberry.field(),
                "cursor": strawberry.field(description="Opaque cursor for `after`."),
            },
        )
        _fill(
            types.connection,
            {
                "edges": list[types.edge],  # type: ignore[name-defined]
                "pageInfo": PageInfo,
                "totalCount": int | None,
                "totalCountIsEstimate": bool | None,
            },
            {
                "edges": strawberry.field(),
                "pageInfo": strawberry.field(name="pageInfo"),
                "totalCount": strawberry.field(
                    name="totalCount",
                    description="Records matching the filter (all pages): exact up to the "
                    "service's cap, an estimate beyond it unless `exactCount: true`.",
                ),
                "totalCountIsEstimate": strawberry.field(
                    name="totalCountIsEstimate",
                    description="True when totalCount is an estimate (more matches than the cap).",
                ),
            },
        )

    def _filter(self, types: ObjectTypes) -> None:
        annotations: dict[str, Any] = {}
        attributes: dict[str, Any] = {}

        def add(name: str, annotation: Any, description: str | None = None) -> None:
            attribute = python_name(name)
            annotations[attribute] = annotation | None
            attributes[attribute] = strawberry.field(
                name=name, default=UNSET, description=description
            )

        for f in types.obj.fields:
            if f.is_one_to_many:
                continue
            if f.is_many_to_one:
                target = self.objects.get(f.target)
                if target is not None:
                    add(f.name, target.filter, f"Conditions on the related {f.target}.")
                    if types.obj.field(f.foreign_key) is None:
                        add(f.foreign_key, UUIDFilter)
                continue
            enum_filter = types.enum_filters.get(f.name)
            if enum_filter is not None:
                add(f.name, enum_filter)
                continue
            if f.type is FieldType.SELECT:
                add(f.name, StringSelectFilter)
                continue
            if f.type is FieldType.MULTI_SELECT:
                add(f.name, StringMultiSelectFilter)
                continue
            mapping = SCALARS.get(f.type)
            if mapping is not None and mapping.filter is not None:
                add(f.name, mapping.filter)
        add("and", list[types.filter], "Every filter matches.")  # type: ignore[name-defined]
        add("or", list[types.filter], "At least one filter matches.")  # type: ignore[name-defined]
        add("not", types.filter, "The filter does not match.")
        _fill(types.filter, annotations, attributes)

    def _order_by(self, types: ObjectTypes) -> None:
        annotations: dict[str, Any] = {}
        attributes: dict[str, Any] = {}
        for f in types.obj.fields:
            if f.sortable:
                attribute = python_name(f.name)
                annotations[attribute] = SortDirection | None
                attributes[attribute] = strawberry.field(name=f.name, default=UNSET)
        _fill(types.order_by, annotations, attributes)

    def _inputs(self, types: ObjectTypes) -> None:
        create: tuple[dict[str, Any], dict[str, Any]] = ({}, {})
        update: tuple[dict[str, Any], dict[str, Any]] = ({}, {})

        def add(name: str, annotation: Any, required: bool, description: str | None) -> None:
            attribute = python_name(name)
            if required:
                create[0][attribute] = annotation
                create[1][attribute] = strawberry.field(name=name, description=description)
            else:
                create[0][attribute] = annotation | None
                create[1][attribute] = strawberry.field(
                    name=name, default=UNSET, description=description
                )
            update[0][attribute] = annotation | None
            update[1][attribute] = strawberry.field(
                name=name, default=UNSET, description=description
            )

        for f in types.obj.fields:
            if f.name in _NOT_WRITABLE or f.is_one_to_many:
                continue
            description = f.description or None
            if f.is_many_to_one:
                add(f.name, RelationInput, False, description)
                if types.obj.field(f.foreign_key) is None:
                    add(f.foreign_key, uuid.UUID, False, f"Id of {f.name}")
                continue
            annotation = self._value_annotation(types, f, for_input=True)
            add(f.name, annotation, f.required_on_create, description)
        _fill(types.create_input, *create)
        _fill(types.update_input, *update)

    def _aggregate(self, types: ObjectTypes) -> None:
        annotations: dict[str, Any] = {"count": int, "countIsEstimate": bool}
        attributes: dict[str, Any] = {
            "count": strawberry.field(description="Records matching."),
            "countIsEstimate": strawberry.field(
                name="countIsEstimate",
                description="True when count is an estimate: only the count was selected and "
                "more records matched than the service's cap (`exactCount: true` counts them).",
            ),
        }
        if types.aggregate_values is not None:
            values_annotations: dict[str, Any] = {}
            values_attributes: dict[str, Any] = {}
            for f in types.obj.fields:
                if f.type in (FieldType.NUMBER, FieldType.CURRENCY):
                    self._plain_field(
                        values_annotations,
                        values_attributes,
                        f.name,
                        float | None,
                        "amount in micros" if f.type is FieldType.CURRENCY else None,
                    )
            _fill(types.aggregate_values, values_annotations, values_attributes)
            for op in ("sum", "avg", "min", "max"):
                annotations[op] = types.aggregate_values | None
                attributes[op] = strawberry.field()
        _fill(types.aggregate, annotations, attributes)

    # -- operations --------------------------------------------------------------------------

    def _operations(self, types: ObjectTypes) -> None:
        obj = types.obj
        ops = RecordOperations(obj)
        singular, plural = pascal(obj.singular), pascal(obj.plural)
        filter_arg = ("filter", types.filter | None, UNSET)
        id_arg = ("id", uuid.UUID, inspect.Parameter.empty)
        record_list = list[types.record]  # type: ignore[name-defined]
        self._add(
            self.query,
            obj.plural,
            ops.list_page,
            (
                filter_arg,
                ("orderBy", list[types.order_by] | None, UNSET),  # type: ignore[name-defined]
                ("limit", int | None, UNSET),
                ("first", int | None, UNSET),
                ("after", str | None, UNSET),
                ("last", int | None, UNSET),
                ("before", str | None, UNSET),
                ("exactCount", bool | None, UNSET),
            ),
            types.connection,
            f"{obj.label_plural or plural}: a page of records.",
        )
        maybe_record = types.record | None
        self._add(
            self.query, obj.singular, ops.get, (id_arg,), maybe_record, f"One {obj.singular} by id."
        )
        self._add(
            self.query,
            f"{obj.singular}History",
            history.query_resolver(obj),
            (id_arg, *history.QUERY_ARGUMENTS),
            history.HistoryConnection,
            f"Changes of one {obj.singular}, newest first.",
        )
        self._add(
            self.query,
            f"{obj.plural}Aggregate",
            ops.aggregate,
            (filter_arg, ("exactCount", bool | None, UNSET)),
            types.aggregate,
            f"Count, sum, avg, min and max over {obj.plural}.",
        )
        create_arg = ("data", types.create_input, inspect.Parameter.empty)
        update_arg = ("data", types.update_input, inspect.Parameter.empty)
        required_filter = ("filter", types.filter, inspect.Parameter.empty)
        self._add(self.mutation, f"create{singular}", ops.create_one, (create_arg,), maybe_record)
        self._add(
            self.mutation,
            f"create{plural}",
            ops.create_many,
            (("data", list[types.create_input], inspect.Parameter.empty),),  # type: ignore[name-defined]
            record_list,
            "All or nothing; errors name the index, e.g. [3].email.",
        )
        match_arg = ("matchOn", str, inspect.Parameter.empty)
        self._add(
            self.mutation,
            f"upsert{singular}",
            ops.upsert_one,
            (create_arg, match_arg),
            maybe_record,
            "Update the record whose matchOn (a unique field) value is the data's, else create.",
        )
        self._add(
            self.mutation,
            f"upsert{plural}",
            ops.upsert_many,
            (("data", list[types.create_input], inspect.Parameter.empty), match_arg),  # type: ignore[name-defined]
            record_list,
            "Per record: update the one whose matchOn (a unique field) value is the record's, "
            "else create; all or nothing.",
        )
        self._add(
            self.mutation, f"update{singular}", ops.update_one, (id_arg, update_arg), maybe_record
        )
        self._add(
            self.mutation,
            f"update{plural}",
            ops.update_many,
            (required_filter, update_arg),
            record_list,
        )
        self._add(
            self.mutation,
            f"delete{singular}",
            ops.delete_one,
            (id_arg,),
            maybe_record,
            "Soft delete.",
        )
        self._add(
            self.mutation,
            f"delete{plural}",
            ops.delete_many,
            (required_filter,),
            record_list,
            "Soft delete.",
        )
        self._add(
            self.mutation,
            f"restore{singular}",
            ops.restore_one,
            (id_arg,),
            maybe_record,
            "Undo a soft delete.",
        )

    def _add(
        self,
        target: dict[str, Any],
        name: str,
        implementation: Resolver,
        arguments: Sequence[tuple[str, Any, Any]],
        returns: Any,
        description: str | None = None,
    ) -> None:
        static = self.static.queries if target is self.query else self.static.mutations
        if name in static or name in target or name in self.query or name in self.mutation:
            self.skipped.append(name)
            log.warning(
                "generated GraphQL operation skipped: the name is taken", extra={"operation": name}
            )
            return
        target[name] = strawberry.field(
            name=name,
            description=description,
            resolver=_resolver(implementation, name, arguments, returns),
        )

    # -- pass 3: decorate ----------------------------------------------------------------------

    def decorate(self) -> None:
        for types in self.objects.values():
            description = types.obj.description or types.obj.label_singular or None
            strawberry.type(types.record, name=types.name, description=description)
            strawberry.type(types.edge, name=f"{types.name}Edge")
            strawberry.type(types.connection, name=f"{types.name}Connection")
            strawberry.input(types.filter, name=f"{types.name}Filter")
            strawberry.input(types.order_by, name=f"{types.name}OrderBy")
            strawberry.input(types.create_input, name=f"{types.name}CreateInput")
            strawberry.input(types.update_input, name=f"{types.name}UpdateInput")
            if types.aggregate_values is not None:
                strawberry.type(types.aggregate_values, name=f"{types.name}AggregateValues")
            strawberry.type(types.aggregate, name=f"{types.name}Aggregate")

    def generated(self) -> GeneratedTypes:
        return GeneratedTypes(
            model=self.model,
            types=self.registry,
            records={singular: types.record for singular, types in self.objects.items()},
            filters={singular: types.filter for singular, types in self.objects.items()},
        )


def _many_to_one(f: FieldModel) -> Resolver:
    def resolve(root: Any, info: strawberry.Info) -> Any:
        return resolve_many_to_one(root, info, f)

    return resolve


def _one_to_many(f: FieldModel, target: ObjectModel) -> Resolver:
    async def resolve(root: Any, info: strawberry.Info, **arguments: Any) -> Any:
        return await resolve_one_to_many(root, info, f, target, **arguments)

    return resolve


def _key_reader(name: str, annotation: Any) -> Any:
    def read(root: Any) -> Any:
        return root.get(name) if isinstance(root, dict) else getattr(root, name, None)

    read.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter("root", inspect.Parameter.POSITIONAL_OR_KEYWORD)],
        return_annotation=annotation,
    )
    return read


def _root(name: str, fields: dict[str, Any]) -> type | None:
    if not fields:
        return None
    cls = type(name, (), {"__module__": GENERATED_MODULE, **fields})
    return strawberry.type(cls, name=name)


@dataclass(frozen=True)
class WorkspaceGraphQL:
    """A built schema: shared by every workspace whose data model has this fingerprint."""

    schema: strawberry.Schema
    fingerprint: str
    skipped: tuple[str, ...]


def build_workspace_schema(
    model: DataModel,
    parts: Sequence[SchemaPart],
    static: StaticNames,
    documents: DocumentCache | None = None,
) -> WorkspaceGraphQL:
    builder = SchemaBuilder(model, static)
    builder.declare()
    builder.define()
    builder.decorate()
    generated = builder.generated()
    contributed = [part.for_model(generated) for part in parts if part.for_model is not None]
    chosen = [*parts, *(part for part in contributed if part is not None)]
    queries = [part.query for part in chosen if part.query is not None]
    mutations = [part.mutation for part in chosen if part.mutation is not None]
    subscriptions = [part.subscription for part in chosen if part.subscription is not None]
    generated_query = _root("GeneratedQuery", builder.query)
    generated_mutation = _root("GeneratedMutation", builder.mutation)
    if generated_query is not None:
        queries.insert(0, generated_query)
    if generated_mutation is not None:
        mutations.insert(0, generated_mutation)
    schema = GatewaySchema(
        query=merge_types("Query", tuple(queries)),
        mutation=merge_types("Mutation", tuple(mutations)) if mutations else None,
        subscription=merge_types("Subscription", tuple(subscriptions)) if subscriptions else None,
        config=schema_config(),
        documents=documents,
    )
    return WorkspaceGraphQL(schema, model.fingerprint, tuple(builder.skipped))


__all__ = [
    "StaticNames",
    "TypeRegistry",
    "WorkspaceGraphQL",
    "build_workspace_schema",
]

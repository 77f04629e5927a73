"""GraphQL errors in the spec's shape: {message, extensions: {code, field?}, path}.

Errors raised by resolvers carry their ServiceError (code and field from the one mapper).
Validation errors (the request does not fit the schema) are BAD_USER_INPUT; the field at fault
is read from the error (the input field or argument it names, relative to the argument, e.g.
`name` or `[3].email`, as the services name them) and `path` is the top-level operation field
the error sits in, so every error says which operation it belongs to.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from graphql import (
    ArgumentNode,
    DocumentNode,
    FieldNode,
    FragmentDefinitionNode,
    FragmentSpreadNode,
    GraphQLError,
    InlineFragmentNode,
    ListValueNode,
    Node,
    ObjectValueNode,
    OperationDefinitionNode,
    SelectionSetNode,
    VariableNode,
    parse,
)
from graphql.error import GraphQLSyntaxError
from strawberry.exceptions import StrawberryInputCoercionError

from crmkit.errors import ServiceError
from gateway.errors import graphql_extensions

_NAMED_IN_MESSAGE = (
    re.compile(r"to include required field '(?P<name>\w+)'"),
    re.compile(r"not to include unknown field '(?P<name>\w+)'"),
    re.compile(r"Argument '[\w.]+\((?P<arg>\w+):\)' of type '[^']*' is required"),
    re.compile(r"Unknown argument '(?P<arg>\w+)'"),
    re.compile(r"Cannot query field '(?P<name>\w+)'"),
)
_VARIABLE = re.compile(r"^Variable '\$(?P<variable>\w+)' (?:has invalid value|got invalid value)")
_VARIABLE_AT = re.compile(r"has invalid value at (?P<at>[\w.\[\]]+):")
# Arguments holding a record (or metadata input) name fields as the services do ("name",
# "[3].email"); fields under other arguments are prefixed with the argument ("filter.age").
_RECORD_ARGUMENTS = frozenset({"data", "input"})


@dataclass(frozen=True)
class RequestErrorInfo:
    field: str | None
    path: list[str | int] | None


def format_graphql_error(
    error: GraphQLError, document: DocumentNode | None = None
) -> dict[str, Any]:
    """One error of the response. `document` (the parsed query) lets validation errors name
    their operation path and field."""
    original = error.original_error
    formatted: dict[str, Any] = {"message": error.message}
    path: list[str | int] | None = list(error.path) if error.path else None
    if isinstance(original, ServiceError):
        formatted["message"] = original.message
        formatted["extensions"] = graphql_extensions(original)
    elif is_request_error(error):
        # Parse and validation errors, and inputs a scalar refused: the request is wrong.
        extensions: dict[str, Any] = {"code": "BAD_USER_INPUT"}
        info = describe_request_error(error, document)
        if info.field is not None:
            extensions["field"] = info.field
        formatted["extensions"] = extensions
        path = path or info.path
    else:
        formatted["message"] = "internal server error"
        formatted["extensions"] = {"code": "INTERNAL_SERVER_ERROR"}
    if error.locations:
        formatted["locations"] = [
            {"line": location.line, "column": location.column} for location in error.locations
        ]
    if path:
        formatted["path"] = path
    return formatted


def is_request_error(error: GraphQLError) -> bool:
    """Parse and validation errors, variables that do not fit, inputs a scalar refused (a
    scalar's parser raises ValueError before any resolver runs, so without a response path)."""
    original = error.original_error
    return (
        original is None
        or isinstance(original, GraphQLError | StrawberryInputCoercionError)
        or (error.path is None and isinstance(original, ValueError))
    )


def parse_quietly(query: str) -> DocumentNode | None:
    try:
        return parse(query)
    except GraphQLSyntaxError:
        return None


def describe_request_error(error: GraphQLError, document: DocumentNode | None) -> RequestErrorInfo:
    """The field a validation error is about, and the top-level field it belongs to."""
    message = error.message
    named: str | None = None
    for pattern in _NAMED_IN_MESSAGE:
        match = pattern.search(message)
        if match:
            named = match.groupdict().get("name") or match.groupdict().get("arg")
            break
    if document is None or not error.nodes:
        return RequestErrorInfo(named, None)
    node = error.nodes[0]
    variable = _VARIABLE.match(message)
    if variable is not None:
        at = _VARIABLE_AT.search(message)
        relative = _join_path(_split_path(at.group("at")) if at else [])
        field = _append(relative, named) if named else relative or None
        argument = _argument_of_variable(document, variable.group("variable"))
        if argument is not None:
            field = _under(argument, field)
        return RequestErrorInfo(field, _path_of_variable(document, variable.group("variable")))
    located = _locate(document, node)
    if located is None:
        return RequestErrorInfo(named, None)
    top_key, argument, segments = located
    if isinstance(node, FieldNode | ArgumentNode) and named is not None:
        return RequestErrorInfo(named, [top_key])
    relative = _join_path(segments)
    if isinstance(node, ObjectValueNode) and named is not None:
        relative = _append(relative, named)  # a required or unknown field of this input object
    field = _under(argument, relative or None) if argument else relative or None
    return RequestErrorInfo(field or named, [top_key])


def _split_path(text: str) -> list[str | int]:
    segments: list[str | int] = []
    for name, index in re.findall(r"\.?(\w+)|\[(\d+)\]", text):
        segments.append(int(index) if index else name)
    return segments


def _join_path(segments: Sequence[str | int]) -> str:
    out = ""
    for segment in segments:
        if isinstance(segment, int):
            out += f"[{segment}]"
        else:
            out += f".{segment}" if out else segment
    return out


def _under(argument: str, relative: str | None) -> str:
    """The field as named to the client: relative to a record argument, else prefixed."""
    if not relative:
        return argument
    if argument in _RECORD_ARGUMENTS:
        return relative
    return f"{argument}{relative}" if relative.startswith("[") else f"{argument}.{relative}"


def _append(base: str, name: str) -> str:
    return f"{base}.{name}" if base else name


def _operations(document: DocumentNode) -> Iterator[OperationDefinitionNode]:
    for definition in document.definitions:
        if isinstance(definition, OperationDefinitionNode):
            yield definition


def _top_fields(document: DocumentNode) -> Iterator[FieldNode]:
    fragments = {
        d.name.value: d for d in document.definitions if isinstance(d, FragmentDefinitionNode)
    }
    for operation in _operations(document):
        yield from _fields_of(operation.selection_set, fragments, set())


def _fields_of(
    selection_set: SelectionSetNode | None,
    fragments: dict[str, FragmentDefinitionNode],
    seen: set[str],
) -> Iterator[FieldNode]:
    if selection_set is None:
        return
    for selection in selection_set.selections:
        if isinstance(selection, FieldNode):
            yield selection
        elif isinstance(selection, InlineFragmentNode):
            yield from _fields_of(selection.selection_set, fragments, seen)
        elif isinstance(selection, FragmentSpreadNode) and selection.name.value not in seen:
            seen.add(selection.name.value)
            fragment = fragments.get(selection.name.value)
            if fragment is not None:
                yield from _fields_of(fragment.selection_set, fragments, seen)


def _key(field: FieldNode) -> str:
    return field.alias.value if field.alias else field.name.value


def _contains(outer: Node, inner: Node) -> bool:
    if outer.loc is None or inner.loc is None:
        return False
    return outer.loc.start <= inner.loc.start and inner.loc.end <= outer.loc.end


def _same(a: Node, b: Node) -> bool:
    return (
        a.loc is not None
        and b.loc is not None
        and a.loc.start == b.loc.start
        and a.loc.end == b.loc.end
    )


def _locate(document: DocumentNode, target: Node) -> tuple[str, str, list[str | int]] | None:
    """(top-level key, argument name, path inside the argument value) of `target`."""
    for top in _top_fields(document):
        if not _contains(top, target):
            continue
        argument, segments = _in_arguments(top, target)
        return _key(top), argument, segments
    return None


def _in_arguments(field: FieldNode, target: Node) -> tuple[str, list[str | int]]:
    """Searches the arguments of `field` and of its sub-selections for `target`."""
    for argument in field.arguments or ():
        if _same(argument, target):
            return argument.name.value, []
        if _contains(argument, target):
            return argument.name.value, _in_value(argument.value, target) or []
    for child in _fields_of(field.selection_set, {}, set()):
        if _contains(child, target):
            return _in_arguments(child, target)
    return "", []


def _in_value(value: Node, target: Node) -> list[str | int] | None:
    if _same(value, target):
        return []
    if isinstance(value, ObjectValueNode):
        for object_field in value.fields:
            if _same(object_field, target):
                return [object_field.name.value]
            found = _in_value(object_field.value, target)
            if found is not None:
                return [object_field.name.value, *found]
    if isinstance(value, ListValueNode):
        for index, item in enumerate(value.values):
            found = _in_value(item, target)
            if found is not None:
                return [index, *found]
    return None


def _uses_variable(node: Node, name: str) -> bool:
    if isinstance(node, VariableNode):
        return node.name.value == name
    if isinstance(node, ObjectValueNode):
        return any(_uses_variable(f.value, name) for f in node.fields)
    if isinstance(node, ListValueNode):
        return any(_uses_variable(v, name) for v in node.values)
    return False


def _argument_of_variable(document: DocumentNode, variable: str) -> str | None:
    for top in _top_fields(document):
        for argument in top.arguments or ():
            if _uses_variable(argument.value, variable):
                return argument.name.value
    return None


def _path_of_variable(document: DocumentNode, variable: str) -> list[str | int] | None:
    for top in _top_fields(document):
        if any(_uses_variable(a.value, variable) for a in top.arguments or ()):
            return [_key(top)]
    return None

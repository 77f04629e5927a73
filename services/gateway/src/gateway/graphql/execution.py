"""The executor of every gateway schema: graphql-core's (through Strawberry's), with a shorter
path for the fields that make up most of an answer.

A record's scalar fields (a list of 20 people selecting 10 fields is 200 of them) are "basic"
Strawberry fields: no resolver of their own, no arguments, no extensions; their value is the
record's key. graphql-core still builds a path, a resolve info and a completion per field. Such a
field is read and coerced here directly, with the same resolver and the same scalar coercion, and
an object whose selected fields are all such fields is answered as one dict. Anything else (a
relation, a field with arguments, `__typename`, a null in a non-null field, a value the scalar
refuses, field middleware) takes graphql-core's own path, which also reports its errors.
"""

from __future__ import annotations

from typing import Any

from graphql import GraphQLEnumType, GraphQLNonNull, GraphQLObjectType, GraphQLScalarType
from graphql.pyutils import Undefined
from strawberry.schema.schema import StrawberryGraphQLCoreExecutionContext

_LEAF_TYPES = (GraphQLScalarType, GraphQLEnumType)
_NOT_PLAIN = object()  # the field needs graphql-core's own path


class GatewayExecutionContext(StrawberryGraphQLCoreExecutionContext):
    def _plain_value(self, parent_type: GraphQLObjectType, source: Any, details: Any) -> Any:
        """The completed value of a basic scalar field, or _NOT_PLAIN."""
        node = details[0].node
        if node.arguments:
            return _NOT_PLAIN
        field_def = parent_type.fields.get(node.name.value)
        if field_def is None:
            return _NOT_PLAIN
        resolve = field_def.resolve
        if resolve is None or not getattr(resolve, "_is_default", False):
            return _NOT_PLAIN
        field_type = field_def.type
        non_null = isinstance(field_type, GraphQLNonNull)
        leaf = field_type.of_type if non_null else field_type
        if not isinstance(leaf, _LEAF_TYPES):
            return _NOT_PLAIN
        try:
            value = resolve(source, None)
            if value is None:
                return _NOT_PLAIN if non_null else None
            coerced = leaf.coerce_output_value(value)
        except Exception:  # graphql-core's path reports it
            return _NOT_PLAIN
        return _NOT_PLAIN if coerced is None or coerced is Undefined else coerced

    def _plain_resolvers(self) -> bool:
        middleware = self.middleware_manager
        return middleware is None or not middleware.middlewares

    def execute_fields(
        self,
        parent_type: GraphQLObjectType,
        source_value: Any,
        path: Any,
        grouped_field_set: Any,
        position_context: Any,
    ) -> Any:
        if self._plain_resolvers():
            results: dict[str, Any] = {}
            for response_name, details in grouped_field_set.items():
                value = self._plain_value(parent_type, source_value, details)
                if value is _NOT_PLAIN:
                    break
                results[response_name] = value
            else:
                return results
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
            if value is not _NOT_PLAIN:
                return value
        return super().execute_field(
            parent_type, source, field_details_list, path, position_context
        )

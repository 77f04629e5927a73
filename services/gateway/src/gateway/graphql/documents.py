"""Parsed and validated GraphQL documents, by schema and query text: clients send the same few
query texts over and over.

One bounded LRU per process, shared by every schema (built in the app and handed to each schema
it builds). A hit costs a dict lookup on the query string (whose hash Python keeps), where
Strawberry's ParserCache and ValidationCache extensions cost two extension hooks per request
and hashed the whole document tree to find its validation. Parsing and validation are
Strawberry's own (`parse`, `validate_document` with the context's rules), so errors are the
same; a query that does not parse is not kept, and Strawberry parses it again to report the
error as before.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from graphql import DocumentNode, GraphQLError, GraphQLSchema, parse
from graphql.validation import ASTValidationRule
from strawberry.schema.schema import validate_document

DOCUMENT_CACHE_SIZE = 512

Prepared = tuple[DocumentNode, list[GraphQLError]]


class DocumentCache:
    def __init__(self, maxsize: int = DOCUMENT_CACHE_SIZE) -> None:
        self._maxsize = maxsize
        self._entries: OrderedDict[tuple[GraphQLSchema, str], Prepared] = OrderedDict()

    def prepared(
        self, schema: GraphQLSchema, query: str, rules: Sequence[type[ASTValidationRule]]
    ) -> Prepared | None:
        """The document of `query` and its validation errors against `schema` (with `rules`,
        the same for every request of a schema); None when it does not parse."""
        key = (schema, query)
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
            return entry
        try:
            document = parse(query)
        except GraphQLError:
            return None
        entry = (document, validate_document(schema, document, tuple(rules)))
        self._entries[key] = entry
        if len(self._entries) > self._maxsize:
            self._entries.popitem(last=False)
        return entry

    def __len__(self) -> int:
        return len(self._entries)

"""`search(query, objects, first, after)`: ranked records of every readable object.

Returns a connection of SearchResult {object, score, matchedFields, record}, where `record` is a
union of the workspace's record types (each result cast to its object's type, so a query
selects fields with `... on Person { firstName }`). Built per data model (`for_model`), since
the union lists the workspace's objects. One call to records' Search.
"""

from __future__ import annotations

import inspect
from typing import Annotated, Any, Optional, Union

import orjson
import strawberry
from strawberry.types.unset import UNSET

from crm.records.v1 import records_pb2
from crmkit.errors import InvalidArgument
from gateway.graphql.context import GraphQLContext
from gateway.graphql.page_info import PageInfo
from gateway.graphql.parts import GeneratedTypes, SchemaPart
from gateway.pagination import page_info_json

MAX_FIRST = 100
_SUFFIXES = ("Record", "Result", "Edge", "Connection")


class _Record(dict[str, Any]):
    """A record dict that can carry strawberry's cast marker (a plain dict cannot); fields are
    read as attributes (the default resolver reads keys of plain dicts only)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return self.get(name)


def _first(value: int | None) -> int:
    if value is None or value is UNSET:
        return 0
    if not 1 <= value <= MAX_FIRST:
        raise InvalidArgument(f"`first` must be between 1 and {MAX_FIRST}", field="first")
    return value


def search_part(generated: GeneratedTypes) -> SchemaPart | None:
    records = {name: kind for name, kind in generated.records.items() if kind is not None}
    if not records:
        return None
    base = generated.types.free_base("Search", _SUFFIXES)
    members = tuple(records.values())
    record_union: Any = Annotated[
        Union[members],  # noqa: UP007  (a runtime tuple of generated types)
        strawberry.union(f"{base}Record", description="The record, as its object's type."),
    ]

    result_type = strawberry.type(
        type(
            f"{base}Result",
            (),
            {
                "__module__": __name__,
                "__annotations__": {
                    "object": str,
                    "score": float,
                    "matchedFields": list[str],
                    "record": Optional[record_union],  # noqa: UP045  (None: object not in this schema yet)
                },
                "object": strawberry.field(description="Singular name of the record's object."),
                "score": strawberry.field(description="Rank: higher is a better match."),
                "matchedFields": strawberry.field(
                    name="matchedFields", description="The searchable fields that matched."
                ),
                "record": strawberry.field(),
            },
        ),
        name=f"{base}Result",
        description="One search result.",
    )
    edge_type = strawberry.type(
        type(
            f"{base}Edge",
            (),
            {
                "__module__": __name__,
                "__annotations__": {"node": result_type, "cursor": str},
            },
        ),
        name=f"{base}Edge",
    )
    connection_type = strawberry.type(
        type(
            f"{base}Connection",
            (),
            {
                "__module__": __name__,
                "__annotations__": {"edges": list[edge_type], "pageInfo": PageInfo},  # type: ignore[valid-type]
                "pageInfo": strawberry.field(name="pageInfo"),
            },
        ),
        name=f"{base}Connection",
    )

    async def resolve(
        info: strawberry.Info,
        query: str,
        objects: list[str] | None = UNSET,
        first: int | None = UNSET,
        after: str | None = UNSET,
    ) -> Any:
        context: GraphQLContext = info.context
        request = records_pb2.SearchRequest(
            query=query,
            objects=objects if isinstance(objects, list) else [],
            first=_first(first),
            after=after if isinstance(after, str) else "",
            metadata_version=context.data_model.version,
        )
        response = await context.ask(context.state.upstreams.records.Search, request)
        edges = []
        for hit in response.hits:
            kind = records.get(hit.object)
            record = _Record(orjson.loads(hit.record_json))
            edges.append(
                {
                    "node": {
                        "object": hit.object,
                        "score": round(hit.score, 4),
                        "matchedFields": list(hit.matched_fields),
                        "record": strawberry.cast(kind, record) if kind is not None else None,
                    },
                    "cursor": hit.cursor,
                }
            )
        return {"edges": edges, "pageInfo": page_info_json(response.page_info)}

    resolve.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            inspect.Parameter(
                "info", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=strawberry.Info
            ),
            inspect.Parameter("query", inspect.Parameter.KEYWORD_ONLY, annotation=str),
            *(
                inspect.Parameter(
                    name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=UNSET
                )
                for name, annotation in (
                    ("objects", list[str] | None),
                    ("first", int | None),
                    ("after", str | None),
                )
            ),
        ],
        return_annotation=connection_type,
    )
    query_type = strawberry.type(
        type(
            "SearchQuery",
            (),
            {
                "__module__": __name__,
                "search": strawberry.field(
                    resolver=resolve,
                    description="Records of every readable object whose searchable fields "
                    "match `query` (prefix, substring, accent- and case-insensitive, "
                    "typo-tolerant), best first.",
                ),
            },
        ),
        name="SearchQuery",
    )
    return SchemaPart(name="search", query=query_type)


SEARCH_PART = SchemaPart(name="search", for_model=search_part)

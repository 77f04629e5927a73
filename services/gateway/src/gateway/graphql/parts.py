"""Static parts of the GraphQL schema, contributed by each feature.

A part is a set of Strawberry types holding Query, Mutation and Subscription fields. The schema
builder merges every part with the types generated from a workspace's metadata. Parts marked
`metadata=True` are also served on the second endpoint, POST /metadata. A part that needs the
generated types (e.g. a subscription per object returning the object's type) sets `for_model`:
called with the workspace's GeneratedTypes whenever a schema is built, it returns the fields
to merge for that data model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import strawberry

from gateway.datamodel.model import DataModel


@dataclass(frozen=True)
class GeneratedTypes:
    """What the builder generated for one data model, for parts that build on it."""

    model: DataModel
    types: Any = None  # the TypeRegistry: every generated type by GraphQL name (`.get(name)`)
    records: Mapping[str, Any] = field(default_factory=dict)  # singular name → record type
    filters: Mapping[str, Any] = field(default_factory=dict)  # singular name → filter input


@dataclass(frozen=True)
class SchemaPart:
    name: str
    query: type | None = None
    mutation: type | None = None
    subscription: type | None = None
    metadata: bool = False  # also served on /metadata
    for_model: Callable[[GeneratedTypes], SchemaPart | None] | None = None


API_VERSION = "v1"


def _api_version() -> str:
    return API_VERSION


@strawberry.type
class VersionQuery:
    api_version: str = strawberry.field(
        resolver=_api_version,
        description="Version of this API; paths and schema change only with it.",
    )


VERSION_PART = SchemaPart(name="version", query=VersionQuery, metadata=True)


def registered_parts() -> tuple[SchemaPart, ...]:
    """Every part, in the order their fields appear in the schema."""
    # Imported here: each part builds on SchemaPart.
    from gateway.auth.graphql import IDENTITY_PART
    from gateway.graphql.metadata_ops import METADATA_PART
    from gateway.graphql.webhooks import WEBHOOKS_PART
    from gateway.graphql.workflows import WORKFLOWS_PART
    from gateway.subscriptions.fields import SUBSCRIPTIONS_PART

    return (
        VERSION_PART,
        IDENTITY_PART,
        METADATA_PART,
        WEBHOOKS_PART,
        WORKFLOWS_PART,
        SUBSCRIPTIONS_PART,
    )

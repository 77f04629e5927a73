"""The framework of the GraphQL schema: the parts each feature contributes.

A part is a set of Strawberry types holding Query, Mutation and Subscription fields. Each
feature defines one `*_PART` beside its operations (graphql/identity.py, graphql/webhooks.py,
subscriptions/fields.py, ...) and imports only this framework; the composition root,
`gateway.app`, is the one place that lists them. The schema builder merges every part with the
types generated from a workspace's metadata. Parts marked `metadata=True` are also served on the
second endpoint, POST /metadata. A part that needs the generated types (e.g. a subscription per
object returning the object's type) sets `for_model`: called with the workspace's
GeneratedTypes whenever a schema is built, it returns the fields to merge for that data model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

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

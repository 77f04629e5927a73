"""The API version, served on /graphql and /metadata."""

from __future__ import annotations

import strawberry

from gateway.graphql.parts import SchemaPart

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

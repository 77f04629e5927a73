"""PageInfo, shared by every connection the gateway serves (records, metadata, later parts)."""

from __future__ import annotations

import strawberry


@strawberry.type(name="PageInfo", description="Where a page sits in the whole list.")
class PageInfo:
    # Named as the JSON keys: sources are dicts read by attribute name.
    hasNextPage: bool  # noqa: N815
    hasPreviousPage: bool  # noqa: N815
    startCursor: str | None  # noqa: N815
    endCursor: str | None  # noqa: N815

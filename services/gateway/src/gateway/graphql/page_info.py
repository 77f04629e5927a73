"""PageInfo, shared by every connection the gateway serves (records, metadata, later parts)."""

from __future__ import annotations

import strawberry

from crm.common.v1 import common_pb2
from gateway.pagination import page_info_json


@strawberry.type(name="PageInfo", description="Where a page sits in the whole list.")
class PageInfo:
    # Named as the JSON keys: sources are dicts read by attribute name.
    hasNextPage: bool  # noqa: N815
    hasPreviousPage: bool  # noqa: N815
    startCursor: str | None  # noqa: N815
    endCursor: str | None  # noqa: N815

    @classmethod
    def of(cls, info: common_pb2.PageInfo) -> PageInfo:
        return cls(**page_info_json(info))

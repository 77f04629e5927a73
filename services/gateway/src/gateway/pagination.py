"""Page sizes and page info shared by REST and GraphQL."""

from __future__ import annotations

import uuid
from typing import Any

from crm.common.v1 import common_pb2
from crmkit.errors import InvalidArgument

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 200


def page_size(value: int | None, *, field: str = "limit") -> int:
    """A requested page size, checked: 1..MAX_PAGE_SIZE, DEFAULT_PAGE_SIZE when absent."""
    if value is None:
        return DEFAULT_PAGE_SIZE
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"`{field}` must be an integer", field=field)
    if value < 1 or value > MAX_PAGE_SIZE:
        raise InvalidArgument(
            f"`{field}` must be between 1 and {MAX_PAGE_SIZE} (got {value})", field=field
        )
    return value


def page_request(first: int | None, after: str | uuid.UUID | None) -> common_pb2.PageRequest:
    """The upstream page of a GraphQL list's `first` (checked) and `after` cursor."""
    return common_pb2.PageRequest(
        first=page_size(first, field="first") if first is not None else 0,
        after=str(after) if after else "",
    )


def page_info_json(info: common_pb2.PageInfo) -> dict[str, Any]:
    """`{hasNextPage, hasPreviousPage, startCursor, endCursor}` (cursors null when empty)."""
    return {
        "hasNextPage": info.has_next_page,
        "hasPreviousPage": info.has_previous_page,
        "startCursor": info.start_cursor or None,
        "endCursor": info.end_cursor or None,
    }

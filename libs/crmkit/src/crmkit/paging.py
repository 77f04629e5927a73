"""Pages of a service's own lists (webhooks, workflows, runs, identity's lists): `first` and an
id as cursor."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from crm.common.v1 import common_pb2
from crmkit.errors import InvalidArgument

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 200


@dataclass(frozen=True)
class Page:
    size: int
    after: uuid.UUID | None


def read_page(request: common_pb2.PageRequest) -> Page:
    if request.first < 0 or request.first > MAX_PAGE_SIZE:
        raise InvalidArgument(f"first must be between 1 and {MAX_PAGE_SIZE}", field="first")
    after: uuid.UUID | None = None
    if request.after:
        try:
            after = uuid.UUID(request.after)
        except ValueError:
            raise InvalidArgument("after must be the id of an item", field="after") from None
    return Page(request.first or DEFAULT_PAGE_SIZE, after)


def page_info(rows: Sequence[Any], page: Page) -> tuple[list[Any], common_pb2.PageInfo]:
    """The page's rows (fetched with one extra row to know whether more follow) and its info."""
    items = list(rows[: page.size])
    info = common_pb2.PageInfo(
        has_next_page=len(rows) > page.size, has_previous_page=page.after is not None
    )
    if items:
        info.start_cursor = str(items[0]["id"])
        info.end_cursor = str(items[-1]["id"])
    return items, info

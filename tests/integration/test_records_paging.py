"""Ordering and keyset cursors: ties, several keys, nulls, both directions, bad cursors."""

from __future__ import annotations

import functools
from typing import Any

import grpc
import pytest

from crm.common.v1 import common_pb2
from crmstack.stack import Stack
from tests.integration.records_client import Workspace, cond, error_of, provision

ASC, DESC = common_pb2.SORT_DIRECTION_ASC, common_pb2.SORT_DIRECTION_DESC


@pytest.fixture(scope="module")
def ws(stack: Stack | None) -> Workspace:
    if stack is None:
        pytest.skip("calls services over gRPC: needs the local launcher")
    workspace = provision(stack)
    rows = [
        {"name": f"c{i:02d}", "employees": [10, 20, None][i % 3], "city": ["B", "A"][i % 2]}
        for i in range(23)
    ]
    workspace.create_many("company", rows)
    return workspace


def order(*keys: tuple[str, common_pb2.SortDirection]) -> list[common_pb2.OrderBy]:
    return [common_pb2.OrderBy(field=f, direction=d) for f, d in keys]


def expected(ws: Workspace, keys: list[tuple[str, bool]]) -> list[str]:
    """The full order computed in Python: nulls largest, id as the final tie breaker."""
    rows, _ = ws.list("company", first=200)
    last_descending = keys[-1][1] if keys else False
    result = sorted(rows, key=lambda r: str(r["id"]), reverse=last_descending)
    for name, descending in reversed(keys):  # stable sorts, least significant key first
        result.sort(key=functools.partial(field_of, name), reverse=descending)
    return [str(r["id"]) for r in result]


def field_of(name: str, row: dict[str, Any]) -> tuple[bool, Any]:
    value = row[name]
    return (value is None, value if value is not None else 0)


@pytest.mark.parametrize(
    "keys",
    [
        [],
        [("employees", False)],
        [("employees", True)],
        [("city", False), ("employees", True)],
        [("city", True), ("name", True)],
    ],
)
def test_pages_cover_every_record_once_in_order(
    ws: Workspace, keys: list[tuple[str, bool]]
) -> None:
    order_by = order(*[(k, DESC if d else ASC) for k, d in keys])
    seen = [row["id"] for row in ws.list_all("company", page=4, order_by=order_by)]
    assert seen == expected(ws, keys)


def test_backward_paging_mirrors_forward(ws: Workspace) -> None:
    order_by = order(("employees", ASC))
    forward = [row["id"] for row in ws.list_all("company", page=5, order_by=order_by)]
    rows, last_page = ws.list("company", last=5, order_by=order_by)
    assert [r["id"] for r in rows] == forward[-5:]
    assert last_page.page_info.has_previous_page
    before, _ = ws.list(
        "company", last=5, before=last_page.page_info.start_cursor, order_by=order_by
    )
    assert [r["id"] for r in before] == forward[-10:-5]


def test_cursors_are_one_per_record(ws: Workspace) -> None:
    rows, response = ws.list("company", first=3)
    assert len(response.cursors) == len(rows) == 3
    assert response.page_info.end_cursor == response.cursors[-1]
    assert response.page_info.has_next_page


@pytest.mark.parametrize("size", [{"first": 4}, {"last": 4}], ids=["forward", "backward"])
def test_page_cursors_only_gives_the_same_page_without_a_cursor_per_record(
    ws: Workspace, size: dict[str, int]
) -> None:
    order_by = order(("employees", DESC))
    rows, full = ws.list("company", order_by=order_by, **size)
    bounded_rows, bounded = ws.list("company", order_by=order_by, page_cursors_only=True, **size)
    assert bounded_rows == rows
    assert list(bounded.cursors) == []
    assert bounded.page_info == full.page_info
    assert bounded.page_info.start_cursor == full.cursors[0]
    assert bounded.page_info.end_cursor == full.cursors[-1]


def test_page_cursors_only_pages_cover_every_record_once(ws: Workspace) -> None:
    order_by = order(("city", ASC), ("employees", DESC))
    seen = [
        row["id"]
        for row in ws.list_all("company", page=4, order_by=order_by, page_cursors_only=True)
    ]
    assert seen == expected(ws, [("city", False), ("employees", True)])


def test_page_cursors_only_with_one_record_and_with_none(ws: Workspace) -> None:
    one, response = ws.list("company", first=1, page_cursors_only=True)
    assert len(one) == 1
    assert response.page_info.start_cursor == response.page_info.end_cursor != ""
    none, empty = ws.list(
        "company",
        filter=cond("name", common_pb2.FILTER_OPERATOR_EQ, "nobody"),
        page_cursors_only=True,
    )
    assert none == []
    assert empty.page_info.start_cursor == empty.page_info.end_cursor == ""


@pytest.mark.parametrize("cursor", ["garbage!!", "eyJhIjoxfQ", "WyJpZDpBIiwgWzFdXQ"])
def test_bad_cursor_is_invalid_argument_after(ws: Workspace, cursor: str) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        ws.list("company", after=cursor)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_of(caught.value).field == "after"


def test_cursor_of_another_order_is_refused(ws: Workspace) -> None:
    _, response = ws.list("company", first=2, order_by=order(("name", ASC)))
    with pytest.raises(grpc.RpcError) as caught:
        ws.list("company", after=response.page_info.end_cursor, order_by=order(("city", ASC)))
    assert error_of(caught.value).field == "after"


@pytest.mark.parametrize(("first", "ok"), [(0, True), (200, True), (201, False), (-1, False)])
def test_page_size_bounds(ws: Workspace, first: int, ok: bool) -> None:
    if ok:
        rows, _ = ws.list("company", first=first)
        assert len(rows) == 23
        return
    with pytest.raises(grpc.RpcError) as caught:
        ws.list("company", first=first)
    assert error_of(caught.value).field == "first"


def test_default_page_is_fifty(ws: Workspace) -> None:
    ws.create_many("person", [{"firstName": f"p{i}"} for i in range(60)])
    rows, response = ws.list("person")
    assert len(rows) == 50
    assert response.page_info.has_next_page


def test_total_count_when_asked(ws: Workspace) -> None:
    _, response = ws.list("company", first=2, with_total_count=True)
    assert response.total_count == 23


def test_unsortable_field_is_refused(ws: Workspace) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        ws.list("company", order_by=order(("people", ASC)))
    assert error_of(caught.value).field == "people"

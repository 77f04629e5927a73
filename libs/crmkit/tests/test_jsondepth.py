from __future__ import annotations

from typing import Any

import pytest

from crmkit.errors import InvalidArgument
from crmkit.jsondepth import check_depth, contains_nul, exceeds_depth


def _nested(depth: int) -> Any:
    value: Any = 1
    for index in range(depth):
        value = [value] if index % 2 else {"a": value}
    return value


def test_depth_counts_arrays_and_objects() -> None:
    assert not exceeds_depth(1, 0)
    assert not exceeds_depth([], 1)
    assert exceeds_depth([], 0)
    assert not exceeds_depth({"a": [1, {"b": 2}]}, 3)
    assert exceeds_depth({"a": [1, {"b": [2]}]}, 3)
    assert not exceeds_depth(_nested(64), 64)
    assert exceeds_depth(_nested(65), 64)


def test_depth_is_measured_without_recursion() -> None:
    assert exceeds_depth(_nested(200_000), 64)  # far past Python's recursion limit


def test_check_depth_names_the_field() -> None:
    check_depth(_nested(10), 10, field="profile", what="the value")
    with pytest.raises(InvalidArgument) as caught:
        check_depth(_nested(11), 10, field="profile", what="the value")
    assert caught.value.field == "profile"
    assert caught.value.message == "the value is nested more than 10 levels deep"


def test_contains_nul_looks_at_every_string_and_key() -> None:
    assert not contains_nul({"a": ["b", 1, None, {"c": "d"}]})
    assert contains_nul({"a": [{"c": "d\x00"}]})
    assert contains_nul({"k\x00": 1})
    assert not contains_nul(_nested(100_000))

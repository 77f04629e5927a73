"""How deeply a JSON value nests, measured without recursion.

Parsers (orjson stops at 1,024 levels), GraphQL variable coercion, filter parsers and value
checks recurse over JSON; measured first, a value nested deeper than Python's stack allows is the
client's 400 naming the field rather than a RecursionError (docs/api.md, "Limits").
"""

from __future__ import annotations

from typing import Any

from crmkit.errors import InvalidArgument

# Levels of arrays and objects in one value: a RAW_JSON field value, a filter.
MAX_JSON_DEPTH = 64
# Levels in a whole document that wraps such values: a GraphQL request's variables.
MAX_DOCUMENT_DEPTH = 100


def exceeds_depth(value: Any, limit: int) -> bool:
    """Whether arrays and objects in `value` nest more than `limit` levels (`[[1]]` is 2)."""
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth > limit:
            return True
        pending.extend((child, depth + 1) for child in children)
    return False


def check_depth(value: Any, limit: int, *, field: str, what: str) -> None:
    """InvalidArgument naming `field` when `value` (described as `what`) nests too deeply."""
    if exceeds_depth(value, limit):
        raise InvalidArgument(f"{what} is nested more than {limit} levels deep", field=field)


def contains_nul(value: Any) -> bool:
    """Whether a string or key anywhere in `value` holds NUL, which PostgreSQL text and jsonb
    refuse (walked without recursion)."""
    pending: list[Any] = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return True
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list | tuple):
            pending.extend(item)
    return False

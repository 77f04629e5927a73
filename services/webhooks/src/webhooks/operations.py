"""Webhook operations `{object|*}.{created|updated|deleted|*}` and how events match them."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from crmkit.errors import InvalidArgument

ACTIONS = ("created", "updated", "deleted")
MAX_OPERATIONS = 50
_OPERATION = re.compile(r"^(\*|[a-z][a-zA-Z0-9]{0,62})\.(\*|created|updated|deleted)$")


def validate_operations(values: Sequence[str], known_objects: Iterable[str]) -> list[str]:
    """The operations, trimmed and without duplicates (order kept), or InvalidArgument."""
    if not values:
        raise InvalidArgument(
            "give at least one operation, e.g. person.created", field="operations"
        )
    if len(values) > MAX_OPERATIONS:
        raise InvalidArgument(f"at most {MAX_OPERATIONS} operations", field="operations")
    known = set(known_objects)
    result: list[str] = []
    for index, raw in enumerate(values):
        value = raw.strip()
        match = _OPERATION.match(value)
        if match is None:
            raise InvalidArgument(
                f"operations[{index}]: {raw!r} must look like {{object|*}}.{{created|updated|"
                "deleted|*}}, e.g. person.created or *.*",
                field="operations",
            )
        if match.group(1) != "*" and match.group(1) not in known:
            raise InvalidArgument(
                f"operations[{index}]: unknown object {match.group(1)!r} (use an object's "
                "singular name)",
                field="operations",
            )
        if value not in result:
            result.append(value)
    return result


def objects_of(operations: Iterable[str]) -> list[str]:
    """The objects operations name, `*` included (every object), sorted."""
    return sorted({operation.partition(".")[0] for operation in operations})


def matching_patterns(object_name: str, action: str) -> list[str]:
    """Every operation that matches an event: exact, object wildcard, action wildcard, both."""
    return [f"{object_name}.{action}", f"{object_name}.*", f"*.{action}", "*.*"]

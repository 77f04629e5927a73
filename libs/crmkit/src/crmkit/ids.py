"""Ids in requests: the one parse of a UUID argument into its canonical text."""

from __future__ import annotations

import uuid

from crmkit.errors import InvalidArgument


def canonical_uuid(value: str, field: str) -> str:
    """`value` as a canonical UUID string; InvalidArgument naming `field` when it is not one."""
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise InvalidArgument(f"{field} must be a UUID", field=field) from None

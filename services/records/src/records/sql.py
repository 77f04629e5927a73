"""Small helpers to write SQL text safely: quoted identifiers and numbered parameters.

Identifiers come from validated metadata names, and are always double-quoted; values are always
bound parameters ($n), never spliced into the text.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

_SAFE_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


@lru_cache(maxsize=8192)  # the names of objects, fields and schemas: a create quotes ~20
def quote(identifier: str) -> str:
    """A double-quoted identifier; refuses anything that is not a plain name."""
    if not _SAFE_IDENTIFIER.match(identifier):
        raise ValueError(f"unsafe SQL identifier {identifier!r}")
    return f'"{identifier}"'


def literal(text: str) -> str:
    """A SQL string literal for constant text chosen by the service (keys, tags), not user data."""
    return "'" + text.replace("'", "''") + "'"


def workspace_schema_name(workspace_id: str) -> str:
    """The Postgres schema holding a workspace's tables: ws_<uuid hex>."""
    return "ws_" + workspace_id.replace("-", "").lower()


class Params:
    """Collects bound values and hands out their $n placeholders, with an explicit cast."""

    def __init__(self, start: list[Any] | None = None) -> None:
        self.values: list[Any] = list(start or [])

    def add(self, value: Any, cast: str | None = None) -> str:
        self.values.append(value)
        placeholder = f"${len(self.values)}"
        return f"{placeholder}::{cast}" if cast else placeholder

"""Keyset pages over (created_at, id) of identity's tables; paging itself is crmkit.paging."""

from __future__ import annotations

from crmkit.paging import Page, page_info, read_page

__all__ = ["Page", "after_clause", "page_info", "read_page"]


def after_clause(alias: str, table: str, parameter: str) -> str:
    """SQL keeping rows after the cursor row (none when the cursor row does not exist)."""
    return (
        f"({parameter}::uuid IS NULL OR ({alias}.created_at, {alias}.id) > "
        f"(SELECT created_at, id FROM identity.{table} WHERE id = {parameter}))"
    )

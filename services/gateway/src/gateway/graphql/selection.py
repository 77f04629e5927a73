"""What a query selects under the current field, fragments included (to ask the services only
for what is needed: nested relations in the same call, a total count only when selected)."""

from __future__ import annotations

from collections.abc import Iterable

from strawberry.types.nodes import FragmentSpread, InlineFragment, SelectedField, Selection


def selected_names(info_fields: Iterable[Selection], *path: str) -> set[str]:
    """Names selected at `path` below the current field (`info.selected_fields`), fragments
    flattened: selected_names(info.selected_fields, "edges", "node") for a connection's nodes."""
    current = _flatten(child for field in _flatten(info_fields) for child in field.selections)
    for name in path:
        current = _flatten(
            child for field in current if field.name == name for child in field.selections
        )
    return {field.name for field in current}


def _flatten(selections: Iterable[Selection]) -> list[SelectedField]:
    out: list[SelectedField] = []
    for selection in selections:
        if isinstance(selection, SelectedField):
            out.append(selection)
        elif isinstance(selection, FragmentSpread | InlineFragment):
            out.extend(_flatten(selection.selections))
    return out

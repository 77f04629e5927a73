"""Route registration that remembers each route's template, for metrics labels.

Register every plain route through `RouteTable.add` with its full path (no include prefixes), so
metrics and traces name `/rest/{object}/{id}`, never a concrete id.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from starlette.types import Scope


class RouteTable:
    def __init__(self) -> None:
        self._templates: dict[Callable[..., Any], str] = {}

    def add(
        self, app: Any, path: str, endpoint: Callable[..., Any], methods: Sequence[str]
    ) -> None:
        app.add_route(path, endpoint, methods=list(methods), include_in_schema=False)
        self._templates[endpoint] = path

    def add_websocket(self, app: Any, path: str, endpoint: Callable[..., Any]) -> None:
        app.router.add_websocket_route(path, endpoint)
        self._templates[endpoint] = path

    def paths(self) -> list[str]:
        """The path of every route added, in order."""
        return list(self._templates.values())

    def template(self, scope: Scope) -> str:
        endpoint = scope.get("endpoint")
        if endpoint is not None and endpoint in self._templates:
            return self._templates[endpoint]
        route = scope.get("route")
        path = getattr(route, "path", None)
        return path if isinstance(path, str) and path else "unmatched"

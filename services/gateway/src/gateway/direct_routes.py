"""The API's hot routes, served without the framework's router when their request's server span
is not recorded: `/graphql` and the records' own REST routes (`/rest/{object}`,
`/rest/{object}/{id}`).

Starlette's router matches a request against the routes in order (a regex and a scope copy each),
then wraps the endpoint in its exception middleware, FastAPI's exit stacks and a per-request
wrapper: ~6% of the gateway's CPU for a REST create or list. Which of these routes a path is
takes a dict lookup, or a split and two set lookups: a path they serve is one the router would
give them too (`exact` paths are the first routes that match them; a literal segment of any other
REST route in `{object}`'s or `{id}`'s place, such as `imports` or `duplicates`, goes on to the
router, as does a method none of them takes). The
endpoint runs as the router would run it (`endpoint` and `path_params` in the scope, the app's
own handlers for its exceptions). A request whose span could be recorded takes the router, whose
FastAPI telemetry names the span by its route template.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.routing import RouteTable

Endpoint = Callable[[Request], Awaitable[Response]]
ExceptionHandler = Callable[[Request, Exception], Awaitable[Response]]

_TELEMETRY = "fastapi.telemetry"  # None in the scope: the request's span is not recorded
COLLECTION = "/rest/{object}"
ITEM = "/rest/{object}/{id}"


def literal_segments(paths: Iterable[str]) -> tuple[frozenset[str], frozenset[str]]:
    """The fixed segments of the REST routes in `{object}`'s place and in `{id}`'s."""
    first: set[str] = set()
    second: set[str] = set()
    for path in paths:
        parts = path.split("/")
        if len(parts) < 3 or parts[1] != "rest":
            continue
        if not parts[2].startswith("{"):
            first.add(parts[2])
        if len(parts) > 3 and not parts[3].startswith("{"):
            second.add(parts[3])
    return frozenset(first), frozenset(second)


def install_direct_routes(
    app: Starlette,
    routes: RouteTable,
    *,
    exact: Mapping[str, Mapping[str, Endpoint]],
    collection: Mapping[str, Endpoint],
    item: Mapping[str, Endpoint],
) -> None:
    """Adds DirectRoutes to `app`, reading the paths of `routes` and the app's exception
    handlers. Call it before adding any other middleware: the first added is the innermost, so
    the others (CORS, body limits, response headers) wrap these routes as they wrap the router."""
    app.add_middleware(
        DirectRoutes,
        exact=exact,
        collection=collection,
        item=item,
        route_paths=routes.paths,
        exception_handlers=app.exception_handlers,
    )


class DirectRoutes:
    """ASGI middleware: the hot routes served directly, everything else passed on."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        exact: Mapping[str, Mapping[str, Endpoint]],
        collection: Mapping[str, Endpoint],
        item: Mapping[str, Endpoint],
        route_paths: Callable[[], Iterable[str]],
        exception_handlers: Mapping[Any, Callable[..., Any]],
    ) -> None:
        """`exact`: path -> method -> endpoint of routes without parameters that are the first
        to match their path; `collection` and `item`: method -> endpoint of COLLECTION and
        ITEM; `route_paths`:
        every route's path (read when the app builds its middleware, after every route is
        added); `exception_handlers`: the app's, read at each error."""
        self.app = app
        self._exact = {path: dict(methods) for path, methods in exact.items()}
        self._collection = dict(collection)
        self._item = dict(item)
        self._reserved_first, self._reserved_second = literal_segments(route_paths())
        self._handlers = exception_handlers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = self._match(scope) if scope["type"] == "http" else None
        if endpoint is None:
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive, send)
        try:
            response = await endpoint(request)
        except Exception as exc:
            handler = self._handler(exc)
            if handler is None:
                raise
            response = await handler(request, exc)
        await response(scope, receive, send)

    def _match(self, scope: Scope) -> Endpoint | None:
        if scope.get(_TELEMETRY, False) is not None or scope.get("root_path"):
            return None
        path: str = scope["path"]
        exact = self._exact.get(path)
        if exact is not None:
            found = exact.get(scope["method"])
            if found is not None:
                scope["endpoint"] = found
                scope["path_params"] = {}
            return found
        parts = path.split("/")
        if len(parts) == 3:  # "", "rest", object
            endpoints, params = self._collection, {"object": parts[2]}
        elif len(parts) == 4 and parts[3] and parts[3] not in self._reserved_second:
            endpoints, params = self._item, {"object": parts[2], "id": parts[3]}
        else:
            return None
        if parts[1] != "rest" or not parts[2] or parts[2] in self._reserved_first:
            return None
        endpoint = endpoints.get(scope["method"])
        if endpoint is not None:
            scope["endpoint"] = endpoint
            scope["path_params"] = params
        return endpoint

    def _handler(self, exc: Exception) -> ExceptionHandler | None:
        """The app's handler for `exc`, as its exception middleware would choose it; None for
        what only the outermost error middleware handles (`Exception` itself)."""
        for cls in type(exc).__mro__:
            if cls is Exception:
                return None
            if cls in self._handlers:
                handler: ExceptionHandler = self._handlers[cls]
                return handler
        return None

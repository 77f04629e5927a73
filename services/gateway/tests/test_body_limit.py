"""The body-size middleware (gateway.body_limit): limits per route, refusals in the route's
error shape, bodies within the limit handed on whole."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse

from gateway.body_limit import BodyLimits, BodySizeLimitMiddleware

LIMITS = BodyLimits(default=100, batch=1000, auth=10)


async def echo(request: Request) -> JSONResponse:
    return JSONResponse({"size": len(await request.body())})


def client() -> httpx.AsyncClient:
    app = Starlette()
    for path in ("/auth/login", "/rest/batch/people", "/rest/people", "/graphql"):
        app.add_route(path, echo, ["POST"])
    app.add_middleware(BodySizeLimitMiddleware, limits=LIMITS)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway")


def test_each_route_has_its_limit() -> None:
    assert LIMITS.for_path("/auth/token") == 10
    assert LIMITS.for_path("/rest/batch/people") == 1000
    assert LIMITS.for_path("/graphql") == 1000
    assert LIMITS.for_path("/metadata") == 100
    assert LIMITS.for_path("/rest/people/1") == 100


async def chunks(size: int) -> AsyncIterator[bytes]:
    for _ in range(size):
        yield b"x"


async def test_over_the_limit_is_413_in_the_route_shape_and_within_is_read_whole() -> None:
    async with client() as http:
        refused = await http.post("/auth/login", content=b"x" * 11)
        assert refused.status_code == 413
        assert refused.json()["error"] == "Payload Too Large"
        assert refused.json()["details"] == {"field": None, "message": refused.json()["message"]}
        refused = await http.post("/graphql", content=chunks(1001))  # streamed, no length
        assert refused.status_code == 413
        assert refused.json()["errors"][0]["extensions"] == {"code": "BAD_USER_INPUT"}
        assert (await http.post("/rest/people", content=chunks(100))).json() == {"size": 100}
        assert (await http.post("/rest/batch/people", content=b"x" * 1000)).json() == {"size": 1000}

"""The hot routes served ahead of the router (gateway.direct_routes): every request gets the
answer the router would give it, the hot routes without the router, errors through the app's
own handlers."""

from __future__ import annotations

import secrets

import httpx
import pytest
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from crmkit import telemetry
from crmkit.errors import NotFound, ServiceError
from gateway.app import create_app
from gateway.direct_routes import (
    COLLECTION,
    ITEM,
    DirectRoutes,
    Endpoint,
    install_direct_routes,
    literal_segments,
)
from gateway.errors import rest_error_response
from gateway.routing import RouteTable
from gateway.server_spans import GatewayApp
from gateway.settings import GatewaySettings


def _echo(name: str) -> Endpoint:
    async def endpoint(request: Request) -> Response:
        if request.path_params.get("id") == "missing":
            raise NotFound("no such record", field="id")
        if request.path_params.get("id") == "broken":
            raise RuntimeError("a bug")
        return JSONResponse(
            {
                "endpoint": name,
                "params": dict(request.path_params),
                "router": "router" in request.scope,  # the framework's router ran
                "body": (await request.body()).decode(),
            }
        )

    endpoint.__name__ = name
    return endpoint


def _app(*, fast: bool) -> GatewayApp:
    app = GatewayApp(telemetry={"tracing": True, "metrics": False, "logs": False})

    async def on_service_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ServiceError)
        return rest_error_response(exc)

    app.add_exception_handler(ServiceError, on_service_error)
    routes = RouteTable()
    graphql = _echo("graphql")
    routes.add(app, "/graphql", graphql, ["GET", "POST"])
    collection = {"GET": _echo("list"), "POST": _echo("create")}
    item = {"GET": _echo("get"), "PATCH": _echo("update"), "DELETE": _echo("delete")}
    routes.add(app, "/rest/search", _echo("search"), ["GET"])
    routes.add(app, "/rest/imports", _echo("list_imports"), ["GET"])
    for method, endpoint in collection.items():
        routes.add(app, COLLECTION, endpoint, [method])
    routes.add(app, "/rest/batch/{object}", _echo("batch"), ["POST"])
    routes.add(app, "/rest/{object}/duplicates", _echo("duplicates"), ["POST"])
    for method, endpoint in item.items():
        routes.add(app, ITEM, endpoint, [method])
    routes.add(app, "/rest/{object}/{id}/history", _echo("history"), ["GET"])
    if fast:
        exact = {"/graphql": {"GET": graphql, "POST": graphql}}
        install_direct_routes(app, routes, exact=exact, collection=collection, item=item)
    return app


REQUESTS = [
    ("POST", "/graphql"),
    ("GET", "/graphql"),
    ("HEAD", "/graphql"),
    ("DELETE", "/graphql"),
    ("POST", "/graphql/"),
    ("GET", "/rest/people"),
    ("POST", "/rest/people"),
    ("HEAD", "/rest/people"),
    ("PUT", "/rest/people"),
    ("GET", "/rest/people/7"),
    ("PATCH", "/rest/people/7"),
    ("DELETE", "/rest/people/7"),
    ("GET", "/rest/people/missing"),
    ("GET", "/rest/search"),
    ("POST", "/rest/search"),
    ("GET", "/rest/imports"),
    ("POST", "/rest/batch/people"),
    ("GET", "/rest/batch/people"),
    ("POST", "/rest/people/duplicates"),
    ("GET", "/rest/people/duplicates"),
    ("GET", "/rest/people/7/history"),
    ("GET", "/rest/people/"),
    ("GET", "/rest//7"),
    ("GET", "/rest"),
    ("GET", "/other/people"),
    ("GET", "/rest/caf%C3%A9"),
]


async def _send(app: GatewayApp, method: str, path: str, traceparent: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
        return await client.request(
            method, path, content=b'{"name":"x"}', headers={"traceparent": traceparent}
        )


def _unsampled() -> str:
    return f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-00"


@pytest.mark.parametrize(("method", "path"), REQUESTS)
async def test_every_request_gets_the_routers_answer(
    method: str, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(telemetry, "_only_sampled_parents", True)  # no exporter, no sampler
    fast = await _send(_app(fast=True), method, path, _unsampled())
    routed = await _send(_app(fast=False), method, path, _unsampled())
    assert (fast.status_code, fast.headers.get("location")) == (
        routed.status_code,
        routed.headers.get("location"),
    )
    if method != "HEAD" and fast.status_code == 200:
        mine, theirs = fast.json(), routed.json()
        assert {**mine, "router": None} == {**theirs, "router": None}
    else:
        assert fast.content == routed.content


@pytest.mark.parametrize(
    ("method", "path", "endpoint", "params"),
    [
        ("POST", "/graphql", "graphql", {}),
        ("GET", "/rest/people", "list", {"object": "people"}),
        ("POST", "/rest/people", "create", {"object": "people"}),
        ("GET", "/rest/people/7", "get", {"object": "people", "id": "7"}),
        ("PATCH", "/rest/people/7", "update", {"object": "people", "id": "7"}),
        ("DELETE", "/rest/people/7", "delete", {"object": "people", "id": "7"}),
    ],
)
async def test_the_hot_routes_skip_the_router_when_their_span_is_not_recorded(
    method: str, path: str, endpoint: str, params: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(telemetry, "_only_sampled_parents", True)
    response = await _send(_app(fast=True), method, path, _unsampled())
    assert response.json() == {
        "endpoint": endpoint,
        "params": params,
        "router": False,
        "body": '{"name":"x"}',
    }
    sampled = f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"
    recorded = await _send(_app(fast=True), method, path, sampled)
    assert recorded.json()["router"] is True  # FastAPI names the recorded span by route


async def test_errors_take_the_apps_handlers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(telemetry, "_only_sampled_parents", True)
    missing = await _send(_app(fast=True), "GET", "/rest/people/missing", _unsampled())
    assert missing.status_code == 404
    assert missing.json()["message"] == "no such record"
    broken = await _send(_app(fast=True), "GET", "/rest/people/broken", _unsampled())
    assert broken.status_code == 500


def test_literal_segments_are_read_off_the_route_paths() -> None:
    paths = ["/rest/open-api", "/rest/{object}", "/rest/imports/{id}/cancel", "/graphql"]
    first, second = literal_segments(
        [*paths, "/rest/{object}/merge", "/rest/{object}/{id}/history", "/auth/login"]
    )
    assert first == {"open-api", "imports"}
    assert second == {"merge"}


def test_the_gateway_serves_them_inside_every_other_middleware() -> None:
    """CORS, body limits and response headers wrap the hot routes as they wrap the router."""
    settings = GatewaySettings(
        APP_SECRET="s" * 32,
        REDIS_URL="redis://localhost",
        NATS_URL="nats://localhost",
        CORS_ORIGINS="https://app.example.com",
        IDENTITY_ADDR="a",
        METADATA_ADDR="a",
        RECORDS_ADDR="a",
        WEBHOOKS_ADDR="a",
        WORKFLOWS_ADDR="a",
    )
    layers: list[object] = [m.cls for m in create_app(settings).user_middleware]
    assert layers[-1] is DirectRoutes  # the last is the innermost
    assert CORSMiddleware in layers

"""The gateway's ASGI app: built by create_app() with everything injected through its lifespan."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from crmkit import messaging
from crmkit.db import create_pool
from crmkit.errors import Internal, InvalidArgument, NotFound, ServiceError
from crmkit.heap import tune_after_startup
from crmkit.metrics import DbPoolCollector, start_metrics_server
from crmkit.principal import PrincipalCodec
from gateway.auth.install import install_auth
from gateway.auth.verify import CredentialVerifier
from gateway.body_limit import BodyLimits, BodySizeLimitMiddleware
from gateway.datamodel.cache import DataModelCache
from gateway.datamodel.sync import follow_announcements, schema_fetcher
from gateway.direct_routes import COLLECTION, ITEM, install_direct_routes
from gateway.errors import rest_error_response
from gateway.framing import framing_headers
from gateway.graphql.builder import StaticNames
from gateway.graphql.documents import DocumentCache
from gateway.graphql.endpoint import (
    WorkspaceSchemas,
    static_graphql_endpoint,
    workspace_graphql_endpoint,
)
from gateway.graphql.exports import EXPORTS_PART
from gateway.graphql.identity import IDENTITY_PART
from gateway.graphql.imports import IMPORTS_PART
from gateway.graphql.metadata_ops import METADATA_PART
from gateway.graphql.parts import SchemaPart
from gateway.graphql.schema import build_static_schema
from gateway.graphql.search import SEARCH_PART
from gateway.graphql.version import VERSION_PART
from gateway.graphql.webhooks import WEBHOOKS_PART
from gateway.graphql.workflows import WORKFLOWS_PART
from gateway.health import healthz, livez, readyz
from gateway.metrics import GatewayMetrics
from gateway.ratelimit.http import rate_limit_headers
from gateway.ratelimit.limiter import RateLimiter
from gateway.redis_connection import PipelinedRedis
from gateway.response_headers import ResponseMiddleware
from gateway.rest import export as rest_export
from gateway.rest import history as rest_history
from gateway.rest import imports
from gateway.rest import routes as rest
from gateway.rest import search as rest_search
from gateway.rest.openapi import open_api
from gateway.routing import RouteTable
from gateway.server_spans import GatewayApp
from gateway.settings import GatewaySettings
from gateway.state import GatewayState
from gateway.subscriptions.endpoint import WorkspaceSchemaSource, graphql_websocket_endpoint
from gateway.subscriptions.feed import RecordEventFeed
from gateway.subscriptions.fields import SUBSCRIPTIONS_PART
from gateway.subscriptions.hub import SubscriptionHub
from gateway.subscriptions.interest import InterestLeases
from gateway.subscriptions.omitted import omitted_record_loader
from gateway.upstreams import Upstreams
from gateway.verified_tokens import VerifiedTokens

log = logging.getLogger("gateway")

# Every feature's GraphQL schema part, in the order their fields appear in the schema: the one
# place that lists them (a new surface defines its `*_PART` and is added here).
SCHEMA_PARTS: tuple[SchemaPart, ...] = (
    VERSION_PART,
    IDENTITY_PART,
    METADATA_PART,
    WEBHOOKS_PART,
    WORKFLOWS_PART,
    IMPORTS_PART,
    SUBSCRIPTIONS_PART,
    EXPORTS_PART,
    SEARCH_PART,
)


# The records' own routes: method -> endpoint (also served ahead of the router: DirectRoutes).
RECORD_COLLECTION = {"GET": rest.list_records, "POST": rest.create_record}
RECORD_ITEM = {"GET": rest.get_record, "PATCH": rest.update_record, "DELETE": rest.delete_record}


def _install_error_handlers(app: FastAPI) -> None:
    async def on_service_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ServiceError)
        return rest_error_response(exc)

    async def on_validation_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        location = [str(part) for part in first.get("loc", ()) if part not in ("body", "query")]
        field = ".".join(location) or None
        return rest_error_response(InvalidArgument(str(first.get("msg")), field=field))

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code == 404:
            return rest_error_response(NotFound(f"no route for {request.url.path}"))
        if exc.status_code == 405:
            response = rest_error_response(InvalidArgument(f"method {request.method} not allowed"))
            response.status_code = 405
            return response
        return rest_error_response(InvalidArgument(str(exc.detail)))

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error", exc_info=exc)
        return rest_error_response(Internal("internal server error"))

    app.add_exception_handler(ServiceError, on_service_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(HTTPException, on_http_error)
    app.add_exception_handler(Exception, on_unexpected)


def _add_rest_routes(app: FastAPI, routes: RouteTable) -> None:
    """The spec's REST table. A request is matched against the routes in order, so the records'
    own routes come as early as precedence allows (each costs a regex match, ~0.7 us, for every
    route before it): a fixed segment still comes before a `{object}` or `{id}` in the same
    place (`merge` and `groupBy` are never read as ids), and routes of different lengths never
    match the same path, so their order among each other does not matter."""
    # two segments
    routes.add(app, "/rest/open-api", open_api, ["GET"])
    routes.add(app, "/rest/imports", imports.list_imports, ["GET"])
    routes.add(app, "/rest/search", rest_search.search, ["GET"])
    for method, endpoint in RECORD_COLLECTION.items():
        routes.add(app, COLLECTION, endpoint, [method])
    # three segments
    routes.add(app, "/rest/imports/{object}", imports.start_import, ["POST"])
    routes.add(app, "/rest/imports/{id}", imports.get_import, ["GET"])
    routes.add(app, "/rest/batch/{object}", rest.create_batch, ["POST"])
    routes.add(app, "/rest/{object}/duplicates", rest.find_duplicates, ["POST"])
    routes.add(app, "/rest/{object}/merge", rest.merge_records, ["PATCH"])
    routes.add(app, "/rest/{object}/groupBy", rest.group_records, ["GET"])
    routes.add(app, "/rest/{object}/export", rest_export.export_records, ["GET"])
    for method, endpoint in RECORD_ITEM.items():
        routes.add(app, ITEM, endpoint, [method])
    # four segments
    routes.add(app, "/rest/imports/{id}/cancel", imports.cancel_import, ["POST"])
    routes.add(app, "/rest/imports/{id}/rejections", imports.import_rejections, ["GET"])
    routes.add(app, "/rest/restore/{object}/{id}", rest.restore_record, ["PATCH"])
    routes.add(app, "/rest/exports/{id}/download", rest_export.download_export, ["GET"])
    routes.add(app, "/rest/{object}/{id}/history", rest_history.record_history, ["GET"])


def create_app(settings: GatewaySettings) -> FastAPI:
    metrics = GatewayMetrics.create()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        upstreams = Upstreams.open(settings)
        redis = PipelinedRedis(settings.REDIS_URL, timeout=2)
        nats = await messaging.connect(settings.NATS_URL, name="gateway")
        database = (
            await create_pool(
                settings.DATABASE_URL, min_size=0, max_size=2, application_name="gateway"
            )
            if settings.DATABASE_URL
            else None
        )
        pools = DbPoolCollector({"gateway": database} if database is not None else {})
        metrics.registry.register(pools)
        principals = PrincipalCodec(settings.APP_SECRET)
        models = DataModelCache(
            schema_fetcher(upstreams, principals), max_age=settings.DATA_MODEL_MAX_AGE
        )
        announcements = await follow_announcements(nats, models)
        hub = SubscriptionHub(metrics, settings.SUBSCRIPTION_QUEUE_SIZE)
        feed = RecordEventFeed(
            nats,
            hub.wants,
            hub.publish,
            metrics,
            load_record=omitted_record_loader(upstreams, principals),
        )
        await feed.start()
        leases = InterestLeases(upstreams.event_interest, principals, hub.workspaces)
        renewing = asyncio.create_task(leases.run(), name="subscription-leases")
        verified_tokens = VerifiedTokens()
        app.state.gateway = GatewayState(
            settings=settings,
            upstreams=upstreams,
            redis=redis,
            nats=nats,
            database=database,
            metrics=metrics,
            principals=principals,
            models=models,
            subscriptions=hub,
            event_interest=leases,
            rate_limiter=RateLimiter(
                redis,
                limit=settings.API_RATE_LIMITING_LIMIT,
                window_ms=settings.API_RATE_LIMITING_TTL,
                metrics=metrics,
            ),
            credentials=CredentialVerifier(
                settings.APP_SECRET, redis, upstreams.auth, metrics, verified_tokens
            ),
            verified_tokens=verified_tokens,
        )
        # /metrics is served on its own port only, never on the public API port.
        metrics_port = start_metrics_server(
            metrics.registry, settings.METRICS_HOST, settings.METRICS_PORT
        )
        tune_after_startup()
        log.info("gateway ready", extra={"port": settings.PORT, "metrics_port": metrics_port})
        try:
            yield
        finally:
            renewing.cancel()
            await asyncio.gather(renewing, return_exceptions=True)
            await feed.stop()
            await announcements.unsubscribe()
            await upstreams.close()
            await redis.close()
            await nats.drain()
            if database is not None:
                await database.close()
            metrics.registry.unregister(pools)

    app = GatewayApp(
        title="CRM data service",
        lifespan=lifespan,
        docs_url="/docs" if settings.is_development else None,
        redoc_url=None,
        openapi_url="/openapi.json" if settings.is_development else None,
        # FastAPI's own OpenTelemetry support makes the server span of every request that could
        # be recorded (named by route template, continuing the caller's traceparent; the others
        # get a span that records nothing: gateway.server_spans). Metrics are Prometheus's
        # (ResponseMiddleware) and logs are our JSON lines, so its metrics and logs stay off.
        telemetry={"tracing": True, "metrics": False, "logs": False},
    )
    _install_error_handlers(app)
    routes = RouteTable()
    # The API's own endpoints first (GraphQL, then REST): every request is matched in order.
    development = settings.is_development
    documents = DocumentCache()  # parsed and validated GraphQL documents, for every schema
    schemas = WorkspaceSchemas(
        SCHEMA_PARTS, StaticNames.of(build_static_schema(SCHEMA_PARTS)), documents
    )
    graphql = workspace_graphql_endpoint(schemas, development=development)
    routes.add(app, "/graphql", graphql, ["GET", "POST"])
    routes.add_websocket(
        app, "/graphql", graphql_websocket_endpoint(WorkspaceSchemaSource(schemas))
    )
    _add_rest_routes(app, routes)
    routes.add(app, "/healthz", healthz, ["GET"])
    routes.add(app, "/livez", livez, ["GET"])
    routes.add(app, "/readyz", readyz, ["GET"])
    # Before any other middleware (install_auth adds CORS); the routes added below are read too.
    install_direct_routes(
        app,
        routes,
        exact={"/graphql": {"GET": graphql, "POST": graphql}},
        collection=RECORD_COLLECTION,
        item=RECORD_ITEM,
    )
    install_auth(app, routes, settings)
    routes.add(
        app,
        "/metadata",
        static_graphql_endpoint(
            build_static_schema(SCHEMA_PARTS, metadata_only=True, documents=documents),
            development=development,
        ),
        ["GET", "POST"],
    )
    app.add_middleware(BodySizeLimitMiddleware, limits=BodyLimits.of(settings))
    app.add_middleware(
        ResponseMiddleware,
        sources=(rate_limit_headers, framing_headers),
        metrics=metrics,
        routes=routes,
    )
    return app

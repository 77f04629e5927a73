"""Everything a request handler may use, built once in the app's lifespan and injected."""

from __future__ import annotations

from dataclasses import dataclass, field

import asyncpg
from nats.aio.client import Client as NatsClient
from starlette.requests import HTTPConnection

from crmkit.principal import PrincipalCodec
from gateway.datamodel.cache import DataModelCache
from gateway.metrics import GatewayMetrics
from gateway.ratelimit.limiter import RateLimiter
from gateway.redis_connection import PipelinedRedis
from gateway.settings import GatewaySettings
from gateway.subscriptions.hub import SubscriptionHub
from gateway.upstreams import Upstreams
from gateway.verified_tokens import VerifiedTokens


@dataclass(frozen=True)
class GatewayState:
    settings: GatewaySettings
    upstreams: Upstreams
    redis: PipelinedRedis
    nats: NatsClient
    database: asyncpg.Pool | None
    metrics: GatewayMetrics
    principals: PrincipalCodec
    # Data models per workspace and what derives from them (GraphQL schemas, OpenAPI).
    models: DataModelCache
    subscriptions: SubscriptionHub
    rate_limiter: RateLimiter
    # Access tokens this process has verified (signature only; revocation is read every time).
    verified_tokens: VerifiedTokens = field(default_factory=VerifiedTokens)


def gateway_state(connection: HTTPConnection) -> GatewayState:
    state: GatewayState = connection.app.state.gateway
    return state

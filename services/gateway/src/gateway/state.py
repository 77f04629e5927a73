"""Everything a request handler may use, built once in the app's lifespan and injected."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import asyncpg
from nats.aio.client import Client as NatsClient
from starlette.requests import HTTPConnection

from crmkit.principal import PrincipalCodec
from gateway.datamodel.cache import DataModelCache
from gateway.metrics import GatewayMetrics
from gateway.ratelimit.contract import RateLimit
from gateway.redis_connection import PipelinedRedis
from gateway.settings import GatewaySettings
from gateway.subscriptions.hub import EventSubscription
from gateway.upstreams import Upstreams
from gateway.verified_tokens import VerifiedTokens

if TYPE_CHECKING:
    from gateway.auth.verify import CredentialVerifier


class EventSubscriptions(Protocol):
    """What handlers need of the subscription hub (gateway.subscriptions.hub.SubscriptionHub)."""

    def subscribe(
        self,
        workspace_id: str,
        object_name: str,
        action: str,
        *,
        predicate: Callable[[Mapping[str, Any]], bool] | None,
        owner_id: str | None,
        on_overflow: Callable[[EventSubscription], None],
    ) -> EventSubscription: ...


class EventInterest(Protocol):
    """What handlers need of the leases on record events (gateway.subscriptions.interest)."""

    async def ensure(self, workspace_id: str) -> None: ...


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
    subscriptions: EventSubscriptions
    # Declared before a subscription is confirmed, so the workspace's events are published.
    event_interest: EventInterest
    rate_limiter: RateLimit
    # One per process: it remembers a Redis outage and identity's answers during it.
    credentials: CredentialVerifier
    # Access tokens this process has verified (signature only; revocation is read every time).
    verified_tokens: VerifiedTokens = field(default_factory=VerifiedTokens)


def gateway_state(connection: HTTPConnection) -> GatewayState:
    state: GatewayState = connection.app.state.gateway
    return state

"""Gateway settings, read once at start."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from crmkit.settings import CommonSettings, Duration, NatsSettings, RedisSettings


class GatewaySettings(CommonSettings, RedisSettings, NatsSettings):
    HOST: str = "0.0.0.0"
    PORT: int = Field(default=3000, ge=1, le=65535)
    # Longer than the idle timeout of load balancers and HTTP client pools (60 s, 15 s): the
    # client side closes an idle connection first, so a request never meets a half-closed one.
    HTTP_KEEPALIVE_TIMEOUT: int = Field(default=75, ge=1)
    IDENTITY_ADDR: str
    METADATA_ADDR: str
    RECORDS_ADDR: str
    WEBHOOKS_ADDR: str
    WORKFLOWS_ADDR: str
    # Only for /healthz: the gateway owns no tables, but reports whether the database answers.
    DATABASE_URL: str | None = Field(default=None, pattern=r"^postgres(ql)?://")
    GRPC_CALL_TIMEOUT: float = Field(default=10.0, gt=0)
    # Data-model changes (create/update objects and fields) wait for their schema migration,
    # which on a large table can take minutes (docs/data-model.md): longer than metadata's own
    # METADATA_MIGRATE_TIMEOUT (120 s), so the answer says what happened.
    METADATA_CHANGE_TIMEOUT: float = Field(default=130.0, gt=0)
    HEALTH_CHECK_TIMEOUT: float = Field(default=1.0, gt=0)
    # Browser origins allowed to call the API (CORS), comma-separated and exact, e.g.
    # `https://app.example.com,http://localhost:5173`. Empty: no CORS headers at all.
    CORS_ORIGINS: str = ""
    # Proxies (IPs or CIDRs, comma-separated) whose X-Forwarded-For names the client, for the
    # per-IP brute-force limits. Empty: the peer address is the client.
    TRUSTED_PROXIES: str = ""
    # How long the OAuth login-and-consent form stays usable (the spec's login token lifetime).
    LOGIN_TOKEN_EXPIRES_IN: Duration = 15 * 60
    # A workspace's cached data model is re-checked (one cheap call) at least this often, in
    # case a NATS announcement was missed while disconnected.
    DATA_MODEL_MAX_AGE: Duration = 60
    # GraphQL subscriptions over WebSocket (docs/subscriptions.md).
    SUBSCRIPTION_QUEUE_SIZE: int = Field(default=4096, ge=1, le=1_000_000)
    SUBSCRIPTION_INIT_TIMEOUT: float = Field(default=3.0, gt=0)
    SUBSCRIPTION_MAX_OPERATIONS: int = Field(default=200, ge=1)
    SUBSCRIPTION_REVALIDATE_INTERVAL: float = Field(default=5.0, gt=0)
    # The API rate limit (docs/api.md): calls per credential within a sliding window of TTL ms.
    API_RATE_LIMITING_TTL: int = Field(default=60_000, ge=1, le=86_400_000)
    API_RATE_LIMITING_LIMIT: int = Field(default=100, ge=1)
    # Request bodies larger than this are refused with 413 before they are read (docs/api.md):
    # /auth/* routes, batch routes (POST /rest/batch/{object} and /graphql), everything else.
    MAX_AUTH_REQUEST_BODY_BYTES: int = Field(default=64 * 1024, ge=1024)
    MAX_BATCH_REQUEST_BODY_BYTES: int = Field(default=32 * 1024 * 1024, ge=1024)
    MAX_REQUEST_BODY_BYTES: int = Field(default=4 * 1024 * 1024, ge=1024)
    # Largest import file (POST /rest/imports/{object}, streamed to records, never held whole).
    IMPORT_MAX_BYTES: int = Field(default=1024 * 1024 * 1024, ge=1024)
    # GraphQL request limits, checked before anything runs (docs/api.md, Query cost).
    GRAPHQL_MAX_DEPTH: int = Field(default=15, ge=1)
    GRAPHQL_MAX_ALIASES: int = Field(default=50, ge=0)
    GRAPHQL_MAX_ROOT_FIELDS: int = Field(default=50, ge=1)
    GRAPHQL_MAX_TOKENS: int = Field(default=15_000, ge=100)
    GRAPHQL_MAX_COST: int = Field(default=25_000, ge=1)

    @field_validator("CORS_ORIGINS")
    @classmethod
    def _origins(cls, value: str) -> str:
        for origin in _split(value):
            parts = urlsplit(origin)
            if (
                parts.scheme not in ("http", "https")
                or not parts.hostname
                or parts.path
                or parts.query
                or parts.fragment
            ):
                raise ValueError(f"{origin!r} is not an origin such as https://app.example.com")
        return value

    @field_validator("TRUSTED_PROXIES")
    @classmethod
    def _proxies(cls, value: str) -> str:
        for network in _split(value):
            ipaddress.ip_network(network, strict=False)
        return value

    @property
    def cors_origins(self) -> list[str]:
        return _split(self.CORS_ORIGINS)

    @property
    def trusted_proxies(self) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
        return [ipaddress.ip_network(item, strict=False) for item in _split(self.TRUSTED_PROXIES)]


def _split(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]

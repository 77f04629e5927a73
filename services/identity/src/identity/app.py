"""serve() builds the identity service's dependencies, injects them and runs until SIGTERM."""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry
from redis.asyncio import Redis

from crm.identity.v1 import identity_pb2, identity_pb2_grpc
from crm.metadata.v1 import metadata_pb2_grpc
from crmkit import db
from crmkit.grpc_client import open_channel
from crmkit.grpc_server import ServicerBinding, ServiceRuntime, run_service, service_name
from crmkit.metrics import observe_pools
from crmkit.principal import PrincipalCodec
from identity.brute_force import AttemptLimiter, attempt_rules
from identity.cache import CredentialCache
from identity.deps import Deps
from identity.mail import EmailJob, SmtpSender, SmtpTarget
from identity.maintenance import Maintenance
from identity.metrics import IdentityMetrics
from identity.passwords import Passwords
from identity.servicers.auth import AuthServicer
from identity.servicers.credentials import CredentialServicer
from identity.servicers.oauth import OAuthServicer
from identity.servicers.roles import RoleServicer
from identity.servicers.workspace import WorkspaceServicer
from identity.sessions import Lifetimes, Sessions
from identity.settings import IdentitySettings

SCHEMA = "identity"
log = logging.getLogger("identity")


async def serve(settings: IdentitySettings) -> None:
    registry = CollectorRegistry()
    metrics = IdentityMetrics.create(registry)
    pool = await db.create_pool(
        settings.DATABASE_URL,
        min_size=settings.DB_POOL_MIN_SIZE,
        max_size=settings.DB_POOL_MAX_SIZE,
        application_name="identity",
    )
    observe_pools(registry, {"identity": pool})
    redis = Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
    metadata_channel = open_channel(
        settings.METADATA_ADDR,
        settings.GRPC_CALL_TIMEOUT,
        settings.GRPC_KEEPALIVE_TIME,
        multiplexed=True,
    )
    cache = CredentialCache(redis, settings.CREDENTIAL_CACHE_TTL, metrics.cache_failures)
    deps = Deps(
        settings=settings,
        pool=pool,
        redis=redis,
        codec=PrincipalCodec(settings.APP_SECRET),
        cache=cache,
        limiter=AttemptLimiter(redis, *attempt_rules(settings)),
        passwords=Passwords(concurrency=settings.PASSWORD_HASH_CONCURRENCY),
        sessions=Sessions(
            settings.APP_SECRET,
            Lifetimes(settings.ACCESS_TOKEN_EXPIRES_IN, settings.REFRESH_TOKEN_EXPIRES_IN),
            cache,
        ),
        metadata=metadata_pb2_grpc.MetadataServiceStub(metadata_channel),
        metrics=metrics,
    )
    background = [Maintenance(pool).run]
    if settings.SMTP_URL:
        sender = SmtpSender(
            SmtpTarget.parse(settings.SMTP_URL), settings.EMAIL_FROM, settings.SMTP_TIMEOUT
        )
        background.append(EmailJob(pool, sender, metrics, settings.EMAIL_MAX_ATTEMPTS).run)
    else:
        log.warning("SMTP_URL is not set: password-reset emails stay queued until it is")

    async def close() -> None:
        await metadata_channel.close()
        await redis.aclose()
        await pool.close()

    def binding(servicer: object, add: object, name: str) -> ServicerBinding:
        return ServicerBinding(servicer, add, service_name(identity_pb2, name))  # type: ignore[arg-type]

    runtime = ServiceRuntime(
        bindings=[
            binding(
                AuthServicer(deps),
                identity_pb2_grpc.add_AuthServiceServicer_to_server,
                "AuthService",
            ),
            binding(
                WorkspaceServicer(deps),
                identity_pb2_grpc.add_WorkspaceServiceServicer_to_server,
                "WorkspaceService",
            ),
            binding(
                RoleServicer(deps),
                identity_pb2_grpc.add_RoleServiceServicer_to_server,
                "RoleService",
            ),
            binding(
                CredentialServicer(deps),
                identity_pb2_grpc.add_CredentialServiceServicer_to_server,
                "CredentialService",
            ),
            binding(
                OAuthServicer(deps),
                identity_pb2_grpc.add_OAuthServiceServicer_to_server,
                "OAuthService",
            ),
        ],
        background=background,
        on_shutdown=[close],
    )
    await run_service(settings, registry, runtime)


async def migrate(settings: IdentitySettings) -> None:
    await db.migrate(settings.DATABASE_URL, SCHEMA, "identity")

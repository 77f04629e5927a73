"""What the servicers share, built once in serve() and injected."""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg
from redis.asyncio import Redis

from crm.metadata.v1 import metadata_pb2_grpc
from crmkit.principal import PrincipalCodec
from identity.brute_force import AttemptLimiter
from identity.cache import CredentialCache
from identity.metrics import IdentityMetrics
from identity.passwords import Passwords
from identity.sessions import Sessions
from identity.settings import IdentitySettings


@dataclass(frozen=True)
class Deps:
    settings: IdentitySettings
    pool: asyncpg.Pool
    redis: Redis
    codec: PrincipalCodec
    cache: CredentialCache
    limiter: AttemptLimiter
    passwords: Passwords
    sessions: Sessions
    metadata: metadata_pb2_grpc.MetadataServiceStub
    metrics: IdentityMetrics

"""Bearer credential → verified Principal, with at most one Redis round trip (which, for an HTTP
request, also counts its call against the rate limit: gateway.ratelimit.limiter).

JWT access tokens are verified locally (signature, algorithm, expiry; a token already verified
by this process is recognised without redoing the HMAC, gateway.verified_tokens); API keys and
personal access tokens are parsed locally. Then one GET of the credential's cache entry (written by
identity on issue, change and revocation) decides: revoked, expired, wrong secret, or the
principal. On a miss (or Redis unreachable) identity answers from Postgres and refills it.

While Redis is unreachable from this gateway, identity's answer for a credential is reused for
`OUTAGE_ANSWER_SECONDS` (only then, and forgotten when Redis answers again), so an outage costs
one identity call per credential a second rather than one per request. A change can commit in
that time only if identity reaches Redis while this gateway does not (changes need Redis), so a
revocation may then take effect here up to that long after it answered.
"""

from __future__ import annotations

import hashlib
import logging
import time

import grpc
from google.protobuf.message import DecodeError
from redis.exceptions import RedisError

from crm.common.v1 import common_pb2
from crm.identity.v1 import identity_pb2, identity_pb2_grpc
from crmkit.errors import ServiceError, Unauthenticated, from_rpc_error
from crmkit.metrics import Children
from crmkit.outages import OutageLog
from crmkit.tokens import (
    Claims,
    SecretKind,
    TokenType,
    accept_credential,
    credential_cache_key,
    decode_jwt,
    grant_of,
    invalid_token,
    parse_secret_token,
)
from gateway.metrics import GatewayMetrics
from gateway.ratelimit.contract import RateLimit
from gateway.ratelimit.limiter import Counted
from gateway.redis_connection import PipelinedRedis
from gateway.verified_tokens import VerifiedTokens

log = logging.getLogger("gateway.auth")

MAX_TOKEN_LENGTH = 4096
OUTAGE_ANSWER_SECONDS = 1.0
_MAX_OUTAGE_ANSWERS = 10_000
_SECRET_KINDS = {
    SecretKind.API_KEY: identity_pb2.CREDENTIAL_KIND_API_KEY,
    SecretKind.PERSONAL_ACCESS_TOKEN: identity_pb2.CREDENTIAL_KIND_PERSONAL_ACCESS_TOKEN,
}


def bearer_token(header: str | None) -> str:
    """The token of an `Authorization: Bearer <token>` value."""
    if header is None or not header.strip():
        raise Unauthenticated(
            "missing credential: send Authorization: Bearer <token>",
            reason=common_pb2.ERROR_REASON_TOKEN_MISSING,
        )
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or " " in token:
        raise invalid_token("invalid credential: expected Authorization: Bearer <token>")
    if len(token) > MAX_TOKEN_LENGTH:
        raise invalid_token()
    return token


class CredentialVerifier:
    """Stateless apart from what it is given: built per app, shared by every request."""

    def __init__(
        self,
        app_secret: str,
        redis: PipelinedRedis,
        auth: identity_pb2_grpc.AuthServiceStub,
        metrics: GatewayMetrics | None = None,
        verified: VerifiedTokens | None = None,
    ) -> None:
        self._secret = app_secret
        self._redis = redis
        self._auth = auth
        self._lookups = Children(metrics.revocation_checks) if metrics is not None else None
        self._checks = Children(metrics.credential_checks) if metrics is not None else None
        self._verified = verified if verified is not None else VerifiedTokens()
        self._outage = OutageLog(
            "redis (credential cache; identity answers)",
            log,
            metrics.outages if metrics is not None else None,
        )
        # (credential id, SHA-256 of the token) -> (principal, until): see the module's doc.
        self._outage_answers: dict[tuple[str, str], tuple[common_pb2.Principal, float]] = {}

    async def verify(self, token: str) -> common_pb2.Principal:
        principal, _ = await self.verify_counting(token, None)
        return principal

    async def verify_counting(
        self, token: str, limiter: RateLimit | None
    ) -> tuple[common_pb2.Principal, Counted | None]:
        """The principal and, with a limiter, the call it counted in the round trip that read
        the credential's entry (None when it could not: see gateway.ratelimit.limiter). A
        credential refused after that has its count taken back."""
        secret_token = parse_secret_token(token)
        claims: Claims | None = None
        if secret_token is not None:
            credential_id = secret_token.credential_id
            request = identity_pb2.ResolveCredentialRequest(
                kind=_SECRET_KINDS[secret_token.kind],
                credential_id=credential_id,
                secret=secret_token.secret,
            )
        else:
            claims = self._claims(token)
            credential_id = grant_of(claims.jti)
            request = identity_pb2.ResolveCredentialRequest(
                kind=identity_pb2.CREDENTIAL_KIND_ACCESS_TOKEN,
                credential_id=credential_id,
                secret=token,
            )
        entry, counted = await self._cached(credential_id, limiter)
        try:
            if entry is None:
                principal = await self._resolve_uncached(request)
            elif secret_token is not None:
                principal = self._accept(entry, secret=secret_token.secret)
            else:
                principal = self._accept(entry, claims=claims)
        except ServiceError:
            if limiter is not None and counted is not None:
                await limiter.undo(counted)
            raise
        if limiter is not None:
            limiter.remember(credential_id, principal)
        return principal, counted

    def _claims(self, token: str) -> Claims:
        """The verified claims of an access token (the signature checked once per process)."""
        claims = self._verified.get(token, time.time())
        if claims is not None:
            return claims
        try:
            claims = decode_jwt(self._secret, token, TokenType.ACCESS)
        except Unauthenticated as exc:
            self._count("local", exc.reason_name)
            raise
        self._verified.put(token, claims)
        return claims

    def _accept(
        self,
        entry: identity_pb2.CachedCredential,
        *,
        secret: str | None = None,
        claims: Claims | None = None,
    ) -> common_pb2.Principal:
        try:
            principal = accept_credential(entry, now=time.time(), secret=secret, claims=claims)
        except Unauthenticated as exc:
            self._count("cache", exc.reason_name)
            raise
        self._count("cache", "OK")
        return principal

    async def _cached(
        self, credential_id: str, limiter: RateLimit | None
    ) -> tuple[identity_pb2.CachedCredential | None, Counted | None]:
        """The credential's cache entry (None: a miss, or Redis unreachable) and the call the
        limiter counted with it, if it did."""
        key = credential_cache_key(credential_id)
        try:
            if limiter is None:
                raw, counted = await self._redis.get(key), None
            else:
                raw, counted = await limiter.read_counting(key, credential_id)
        except RedisError as exc:
            self._count_lookup("error")
            self._outage.failed(exc)
            return None, None
        if self._outage.down:
            self._outage.recovered()
            self._outage_answers.clear()
        if not isinstance(raw, bytes):
            self._count_lookup("miss")
            return None, counted
        self._count_lookup("hit")
        entry = identity_pb2.CachedCredential()
        try:
            entry.ParseFromString(raw)
        except DecodeError:
            return None, counted
        return entry, counted

    async def _resolve_uncached(
        self, request: identity_pb2.ResolveCredentialRequest
    ) -> common_pb2.Principal:
        """Identity's answer on a miss, reused briefly while Redis is unreachable."""
        if not self._outage.down:
            return await self._resolve(request)
        key = (request.credential_id, hashlib.sha256(request.secret.encode()).hexdigest())
        now = time.monotonic()
        known = self._outage_answers.get(key)
        if known is not None and known[1] > now:
            return known[0]
        principal = await self._resolve(request)
        if len(self._outage_answers) >= _MAX_OUTAGE_ANSWERS:
            self._outage_answers.clear()
        self._outage_answers[key] = (principal, now + OUTAGE_ANSWER_SECONDS)
        return principal

    async def _resolve(
        self, request: identity_pb2.ResolveCredentialRequest
    ) -> common_pb2.Principal:
        try:
            principal: common_pb2.Principal = await self._auth.ResolveCredential(request)
        except grpc.aio.AioRpcError as exc:
            error = from_rpc_error(exc)
            self._count("identity", error.reason_name)
            raise error from None
        self._count("identity", "OK")
        return principal

    def _count_lookup(self, result: str) -> None:
        if self._lookups is not None:
            self._lookups(result).inc()

    def _count(self, source: str, outcome: str) -> None:
        if self._checks is not None:
            self._checks(source, outcome).inc()

"""Whether the author of a webhook or workflow may still read what it passes on.

A webhook or workflow keeps who last saved it, its author: a user, or an API key. Before a
delivery or a run passes records of an object on, the author's current principal is asked of
identity (AuthService/ResolveAuthor) and checked as at save time (`crmkit.authz.require_full_read`:
READ on every record of the object). Answers are kept per author for AUTHOR_CACHE_SECONDS, so a
burst of events costs one identity call per author, and a role change, a removed member or a
deleted API key applies to what is sent within that time (docs/auth.md).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import grpc

from crm.common.v1 import common_pb2
from crm.identity.v1 import identity_pb2
from crmkit.authz import READ, object_access
from crmkit.principal import PrincipalCodec, system_principal

AUTHOR_CACHE_SECONDS = 5.0
_CACHE_LIMIT = 10_000  # authors kept before expired answers are dropped
NO_AUTHOR = "no author on record (saved before authors were kept): save it again"


@dataclass(frozen=True)
class Author:
    """Who saved a webhook or workflow: a user (sessions, personal tokens, OAuth), an API key,
    or nobody known (rows saved before authors were kept, system principals)."""

    user_id: str | None = None
    api_key_id: str | None = None

    @classmethod
    def of(cls, principal: common_pb2.Principal) -> Author:
        if principal.user_id:
            return cls(user_id=principal.user_id)
        if principal.kind == common_pb2.PRINCIPAL_KIND_API_KEY and principal.credential_id:
            return cls(api_key_id=principal.credential_id)
        return cls()

    def columns(self) -> dict[str, str | None]:
        """The columns webhooks and workflows keep their author in."""
        return {"author_user_id": self.user_id, "author_api_key_id": self.api_key_id}


class AuthorUnavailable(Exception):
    """Identity could not be asked now: try again later (nothing was sent)."""


def refusal_for(
    author: Author, principal: common_pb2.Principal | None, objects: Iterable[str]
) -> str | None:
    """Why `author` (whose current principal is `principal`, None when gone) may not pass on
    records of `objects`, or None when it may."""
    if author.user_id is None and author.api_key_id is None:
        return NO_AUTHOR
    if principal is None:
        if author.user_id is not None:
            return "author is no longer a member of the workspace"
        return "author API key was deleted or has expired"
    for object_name in objects:
        access = object_access(principal, object_name, READ)
        if access is None:
            return f"author may no longer read {object_name}"
        if access.own_records_only:
            return f"author may no longer read every record of {object_name}"
    return None


class AuthorAccess:
    """The current principals of authors, from identity, cached per author for `ttl` seconds."""

    def __init__(
        self,
        auth: Any,  # crm.identity.v1 AuthServiceStub
        principals: PrincipalCodec,
        ttl: float = AUTHOR_CACHE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._auth = auth
        self._principals = principals
        self._ttl = ttl
        self._clock = clock
        self._cache: dict[tuple[str, Author], tuple[float, common_pb2.Principal | None]] = {}
        self._asking: dict[tuple[str, Author], asyncio.Future[common_pb2.Principal | None]] = {}

    async def refusal(
        self, workspace_id: str, author: Author, objects: Iterable[str]
    ) -> str | None:
        """Why the author may not pass on records of `objects` now, or None when it may.
        Raises AuthorUnavailable when identity cannot be asked."""
        if author.user_id is None and author.api_key_id is None:
            return NO_AUTHOR
        return refusal_for(author, await self.principal(workspace_id, author), objects)

    async def principal(self, workspace_id: str, author: Author) -> common_pb2.Principal | None:
        """The author's current principal (None: no longer a member, or key deleted/expired);
        concurrent askers of one author share one call."""
        key = (workspace_id, author)
        cached = self._cache.get(key)
        if cached is not None and cached[0] > self._clock():
            return cached[1]
        asking = self._asking.get(key)
        if asking is None:
            asking = asyncio.ensure_future(self._ask(workspace_id, author))
            self._asking[key] = asking
            asking.add_done_callback(lambda done: self._settle(key, done))
        return await asyncio.shield(asking)

    def _settle(
        self, key: tuple[str, Author], done: asyncio.Future[common_pb2.Principal | None]
    ) -> None:
        self._asking.pop(key, None)
        if done.cancelled() or done.exception() is not None:
            return
        if len(self._cache) >= _CACHE_LIMIT:
            now = self._clock()
            self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
        self._cache[key] = (self._clock() + self._ttl, done.result())

    async def _ask(self, workspace_id: str, author: Author) -> common_pb2.Principal | None:
        request = (
            identity_pb2.ResolveAuthorRequest(user_id=author.user_id)
            if author.user_id is not None
            else identity_pb2.ResolveAuthorRequest(api_key_id=author.api_key_id)
        )
        try:
            principal: common_pb2.Principal = await self._auth.ResolveAuthor(
                request, metadata=self._principals.metadata(system_principal(workspace_id))
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise AuthorUnavailable(f"cannot check the author's access: {exc.details()}") from None
        return principal

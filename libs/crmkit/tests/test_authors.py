from __future__ import annotations

import asyncio
from typing import Any

from crm.common.v1 import common_pb2
from crm.identity.v1 import identity_pb2
from crmkit.authors import NO_AUTHOR, Author, AuthorAccess, refusal_for
from crmkit.authz import READ, WRITE
from crmkit.principal import PrincipalCodec

USER = Author(user_id="u1")
KEY = Author(api_key_id="k1")


def _principal(*permissions: common_pb2.ObjectPermission) -> common_pb2.Principal:
    return common_pb2.Principal(workspace_id="ws", user_id="u1", permissions=permissions)


PEOPLE = _principal(common_pb2.ObjectPermission(object="person", actions=[READ, WRITE]))
OWN = _principal(common_pb2.ObjectPermission(object="*", actions=[READ], own_records_only=True))


def test_the_author_is_the_user_or_else_the_api_key() -> None:
    user = common_pb2.Principal(
        kind=common_pb2.PRINCIPAL_KIND_PERSONAL_ACCESS_TOKEN, user_id="u1", credential_id="t1"
    )
    key = common_pb2.Principal(kind=common_pb2.PRINCIPAL_KIND_API_KEY, credential_id="k1")
    system = common_pb2.Principal(kind=common_pb2.PRINCIPAL_KIND_SYSTEM)
    assert Author.of(user) == USER
    assert Author.of(key) == KEY
    assert Author.of(system) == Author()
    assert KEY.columns() == {"author_user_id": None, "author_api_key_id": "k1"}


def test_refusals_name_the_object_or_the_missing_author() -> None:
    assert refusal_for(USER, PEOPLE, ["person"]) is None
    assert refusal_for(USER, PEOPLE, ["person", "company"]) == "author may no longer read company"
    assert refusal_for(USER, OWN, ["person"]) == "author may no longer read every record of person"
    assert refusal_for(USER, None, ["person"]) == "author is no longer a member of the workspace"
    assert refusal_for(KEY, None, []) == "author API key was deleted or has expired"
    assert refusal_for(Author(), PEOPLE, ["person"]) == NO_AUTHOR


class _Identity:
    """Answers ResolveAuthor with `principal`, counting calls."""

    def __init__(self, principal: common_pb2.Principal) -> None:
        self.principal = principal
        self.calls = 0

    async def ResolveAuthor(  # noqa: N802
        self, request: identity_pb2.ResolveAuthorRequest, metadata: Any
    ) -> common_pb2.Principal:
        self.calls += 1
        await asyncio.sleep(0)
        return self.principal


async def test_answers_are_cached_per_author_for_the_ttl() -> None:
    now = [100.0]
    identity = _Identity(PEOPLE)
    access = AuthorAccess(identity, PrincipalCodec("secret"), ttl=5.0, clock=lambda: now[0])
    answers = await asyncio.gather(*(access.refusal("ws", USER, ["person"]) for _ in range(20)))
    assert answers == [None] * 20
    assert identity.calls == 1  # concurrent askers share one call
    identity.principal = _principal()
    now[0] += 4.9
    assert await access.refusal("ws", USER, ["person"]) is None
    now[0] += 0.2
    assert await access.refusal("ws", USER, ["person"]) == "author may no longer read person"
    assert identity.calls == 2
    assert await access.refusal("ws", Author(), ["person"]) == NO_AUTHOR
    assert identity.calls == 2

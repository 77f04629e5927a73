"""Authorization from a principal: object actions, own-records-only roles, OAuth scopes, flags.

Pure functions; every service that owns data calls them with the principal it received.
"""

from __future__ import annotations

from dataclasses import dataclass

from crm.common.v1 import common_pb2
from crmkit.errors import PermissionDenied

READ = common_pb2.ACTION_READ
WRITE = common_pb2.ACTION_WRITE
DELETE = common_pb2.ACTION_DELETE

_ACTION_NAMES: dict[int, str] = {READ: "READ", WRITE: "WRITE", DELETE: "DELETE"}
# An OAuth scope verb grants these actions: read:<object>, write:<object> (write includes delete).
_SCOPE_ACTIONS: dict[str, set[int]] = {"read": {READ}, "write": {WRITE, DELETE}}


@dataclass(frozen=True)
class Access:
    """What a permitted call may touch: every record, or only those the principal owns."""

    own_records_only: bool
    owner_id: str  # the principal's user id, for ownerId filters and defaults


def _scope_allows(scopes: list[str], object_name: str, action: int) -> bool:
    for scope in scopes:
        if scope == "*":
            return True
        verb, _, target = scope.partition(":")
        if target in ("*", object_name) and action in _SCOPE_ACTIONS.get(verb, set()):
            return True
    return False


def object_access(principal: common_pb2.Principal, object_name: str, action: int) -> Access | None:
    """How `principal` may do `action` on records of `object_name`, or None when it may not."""
    if principal.kind == common_pb2.PRINCIPAL_KIND_OAUTH and not _scope_allows(
        list(principal.scopes), object_name, action
    ):
        return None
    best: Access | None = None
    for permission in principal.permissions:
        if permission.object not in ("*", object_name) or action not in permission.actions:
            continue
        access = Access(permission.own_records_only, principal.user_id)
        if not access.own_records_only:
            return access
        best = access
    return best


def require_object_access(principal: common_pb2.Principal, object_name: str, action: int) -> Access:
    """Like object_access, raising PermissionDenied naming the action and object."""
    access = object_access(principal, object_name, action)
    if access is None:
        raise PermissionDenied(
            f"permission denied: {_ACTION_NAMES.get(action, str(action))} on {object_name}",
            metadata={"action": _ACTION_NAMES.get(action, ""), "object": object_name},
        )
    return access


def require_full_read(principal: common_pb2.Principal, object_name: str) -> None:
    """READ on every record of `object_name` ("*": of every object), not only the principal's
    own: what a webhook or workflow saved by this principal may pass on (docs/auth.md)."""
    access = object_access(principal, object_name, READ)
    if access is None or access.own_records_only:
        shown = "every object" if object_name == "*" else object_name
        raise PermissionDenied(
            f"permission denied: READ on every record of {shown}",
            metadata={"action": "READ", "object": object_name},
        )


def require_full_scope(principal: common_pb2.Principal) -> None:
    """OAuth tokens reach anything beyond records (settings, metadata, webhooks, workflows, keys,
    roles) only with the `*` scope; other credentials are not narrowed by scopes."""
    if principal.kind == common_pb2.PRINCIPAL_KIND_OAUTH and "*" not in principal.scopes:
        raise PermissionDenied(
            "permission denied: OAuth tokens need the * scope for workspace settings",
            metadata={"scope": "*"},
        )


def has_flag(principal: common_pb2.Principal, flag: int) -> bool:
    return flag in principal.flags


def require_flag(principal: common_pb2.Principal, flag: int) -> None:
    """The flag's operations: the principal's role has the flag and, for OAuth, the `*` scope."""
    require_full_scope(principal)
    if not has_flag(principal, flag):
        name = common_pb2.Flag.Name(flag).removeprefix("FLAG_")
        raise PermissionDenied(f"permission denied: requires {name}", metadata={"flag": name})

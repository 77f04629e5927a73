"""Who may call identity's own operations."""

from __future__ import annotations

from crm.common.v1 import common_pb2
from crmkit.authz import require_flag, require_full_scope
from crmkit.errors import PermissionDenied

_USER_KINDS = (
    common_pb2.PRINCIPAL_KIND_USER,
    common_pb2.PRINCIPAL_KIND_PERSONAL_ACCESS_TOKEN,
    common_pb2.PRINCIPAL_KIND_OAUTH,
)


def require_admin(principal: common_pb2.Principal) -> None:
    """Member, role and OAuth-client management: the Admin role only."""
    require_full_scope(principal)
    if principal.role != common_pb2.ROLE_ADMIN:
        raise PermissionDenied(
            "permission denied: requires the Admin role", metadata={"role": "Admin"}
        )


def require_api_keys_flag(principal: common_pb2.Principal) -> None:
    require_flag(principal, common_pb2.FLAG_API_KEYS_AND_WEBHOOKS)


def require_user(principal: common_pb2.Principal) -> str:
    """The acting user's id; API keys and system principals act for no user."""
    require_full_scope(principal)
    if principal.kind not in _USER_KINDS or not principal.user_id:
        raise PermissionDenied("permission denied: only a user can do this")
    return principal.user_id

"""The caller's identity in gRPC metadata, signed so only holders of APP_SECRET can mint one.

The gateway authenticates a request and forwards its Principal; services verify the signature
(constant time) and authorize what they serve. Services that call each other forward the
principal they received.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence

import grpc

from crm.common.v1 import common_pb2
from crmkit.errors import Unauthenticated

PRINCIPAL_KEY = "x-crm-principal-bin"
SIGNATURE_KEY = "x-crm-principal-sig-bin"

Metadata = Sequence[tuple[str, str | bytes]]


class PrincipalCodec:
    """Encodes and verifies principals with a key derived from APP_SECRET."""

    def __init__(self, app_secret: str) -> None:
        self._key = hashlib.sha256(b"crm-principal:" + app_secret.encode()).digest()

    def metadata(self, principal: common_pb2.Principal) -> list[tuple[str, str | bytes]]:
        payload = principal.SerializeToString(deterministic=True)
        return [(PRINCIPAL_KEY, payload), (SIGNATURE_KEY, self._sign(payload))]

    def read(self, metadata: Metadata | None) -> common_pb2.Principal | None:
        """The verified principal in `metadata`, None when there is none.

        Raises Unauthenticated when a principal is present but its signature is wrong.
        """
        payload: bytes | None = None
        signature: bytes | None = None
        for key, value in metadata or ():
            if key == PRINCIPAL_KEY and isinstance(value, bytes):
                payload = value
            elif key == SIGNATURE_KEY and isinstance(value, bytes):
                signature = value
        if payload is None:
            return None
        if signature is None or not hmac.compare_digest(signature, self._sign(payload)):
            raise Unauthenticated("principal signature invalid")
        principal = common_pb2.Principal()
        principal.ParseFromString(payload)
        return principal

    def require(self, context: grpc.aio.ServicerContext) -> common_pb2.Principal:
        """The verified principal of an incoming call; Unauthenticated when missing."""
        principal = self.read(context.invocation_metadata())
        if principal is None or not principal.workspace_id:
            raise Unauthenticated("missing principal")
        return principal

    def optional(self, context: grpc.aio.ServicerContext) -> common_pb2.Principal | None:
        return self.read(context.invocation_metadata())

    def _sign(self, payload: bytes) -> bytes:
        return hmac.new(self._key, payload, hashlib.sha256).digest()


def system_principal(workspace_id: str, *, workflow_id: str = "") -> common_pb2.Principal:
    """A principal for a service acting on its own within one workspace (full access)."""
    return common_pb2.Principal(
        workspace_id=workspace_id,
        kind=common_pb2.PRINCIPAL_KIND_SYSTEM,
        role=common_pb2.ROLE_ADMIN,
        role_name="System",
        permissions=[
            common_pb2.ObjectPermission(
                object="*",
                actions=[common_pb2.ACTION_READ, common_pb2.ACTION_WRITE, common_pb2.ACTION_DELETE],
            )
        ],
        flags=[
            common_pb2.FLAG_API_KEYS_AND_WEBHOOKS,
            common_pb2.FLAG_WORKFLOWS,
            common_pb2.FLAG_DATA_MODEL,
            common_pb2.FLAG_WORKSPACE_MEMBERS,
        ],
        workflow_id=workflow_id,
    )

from __future__ import annotations

import pytest

from crm.common.v1 import common_pb2
from crmkit.errors import Unauthenticated
from crmkit.principal import PRINCIPAL_KEY, SIGNATURE_KEY, PrincipalCodec, system_principal


def test_round_trip() -> None:
    codec = PrincipalCodec("a" * 32)
    principal = system_principal("ws-1", workflow_id="wf-9")
    assert codec.read(codec.metadata(principal)) == principal


def test_absent_principal_is_none() -> None:
    assert PrincipalCodec("a" * 32).read([("other", "x")]) is None


def test_signature_from_another_secret_is_refused() -> None:
    metadata = PrincipalCodec("a" * 32).metadata(system_principal("ws-1"))
    with pytest.raises(Unauthenticated):
        PrincipalCodec("b" * 32).read(metadata)


def test_tampered_payload_is_refused() -> None:
    codec = PrincipalCodec("a" * 32)
    metadata = dict(codec.metadata(system_principal("ws-1")))
    forged = common_pb2.Principal(workspace_id="ws-2", role=common_pb2.ROLE_ADMIN)
    tampered = [
        (PRINCIPAL_KEY, forged.SerializeToString()),
        (SIGNATURE_KEY, metadata[SIGNATURE_KEY]),
    ]
    with pytest.raises(Unauthenticated):
        codec.read(tampered)


def test_missing_signature_is_refused() -> None:
    payload = system_principal("ws-1").SerializeToString()
    with pytest.raises(Unauthenticated):
        PrincipalCodec("a" * 32).read([(PRINCIPAL_KEY, payload)])

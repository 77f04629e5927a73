"""The principals identity issues, enforced by the records service: a Member sees only records
they own (another member's record is 404, see docs/decisions.md), a custom role without WRITE is
403 naming the action and object, OAuth scopes narrow the role, other workspaces are invisible.

Each caller authenticates over HTTP; the principal used for the records call is the one the
gateway forwards, obtained from identity's AuthService/ResolveCredential for that credential.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import orjson
import pytest

from crm.common.v1 import common_pb2
from crm.identity.v1 import identity_pb2, identity_pb2_grpc
from crm.records.v1 import records_pb2 as rp
from crm.records.v1 import records_pb2_grpc
from crmkit.principal import PrincipalCodec
from crmstack.client import Session, graphql_data, login, signup, unique_email
from crmstack.stack import Stack


class Caller:
    """Calls the records service with the principal the gateway derives from a credential."""

    def __init__(self, stack: Stack, channels: dict[str, grpc.Channel], token: str) -> None:
        auth = identity_pb2_grpc.AuthServiceStub(channels["identity"])
        kind = (
            identity_pb2.CREDENTIAL_KIND_API_KEY
            if token.startswith("crm_ak_")
            else identity_pb2.CREDENTIAL_KIND_ACCESS_TOKEN
        )
        request = identity_pb2.ResolveCredentialRequest(kind=kind, secret=token)
        if kind == identity_pb2.CREDENTIAL_KIND_API_KEY:
            hex_id, secret = token.removeprefix("crm_ak_").split("_", 1)
            request = identity_pb2.ResolveCredentialRequest(
                kind=kind, credential_id=hex_id, secret=secret
            )
        self.principal: common_pb2.Principal = auth.ResolveCredential(request)
        self._metadata = PrincipalCodec(stack.env["APP_SECRET"]).metadata(self.principal)
        self._records = records_pb2_grpc.RecordsServiceStub(channels["records"])

    def create(self, obj: str, data: dict[str, Any]) -> dict[str, Any]:
        response = self._records.CreateRecord(
            rp.CreateRecordRequest(ref=rp.ObjectRef(object=obj), data_json=orjson.dumps(data)),
            metadata=self._metadata,
        )
        record: dict[str, Any] = orjson.loads(response.record_json)
        return record

    def get(self, obj: str, record_id: str) -> dict[str, Any]:
        response = self._records.GetRecord(
            rp.GetRecordRequest(ref=rp.ObjectRef(object=obj), id=record_id),
            metadata=self._metadata,
        )
        record: dict[str, Any] = orjson.loads(response.record_json)
        return record

    def ids(self, obj: str) -> set[str]:
        response = self._records.ListRecords(
            rp.ListRecordsRequest(ref=rp.ObjectRef(object=obj)), metadata=self._metadata
        )
        return {row["id"] for row in orjson.loads(response.records_json)}


@pytest.fixture(scope="module")
def channels(stack: Stack | None) -> Iterator[dict[str, grpc.Channel]]:
    if stack is None:
        pytest.skip("calls the records service over gRPC: needs the local launcher")
    opened = {
        name: grpc.insecure_channel(stack.grpc_address(name)) for name in ("identity", "records")
    }
    yield opened
    for channel in opened.values():
        channel.close()


def _member(client: httpx.Client, admin: Session, role_id: str | None = None) -> Session:
    email = unique_email("member")
    graphql_data(
        client,
        admin.access_token,
        "mutation($input: AddWorkspaceMemberInput!) { addWorkspaceMember(input: $input) { id } }",
        {"input": {"email": email, "password": "member password", "roleId": role_id}},
    )
    return login(client, email, "member password", admin.workspace_id)


def _code(call: Any) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    code: grpc.StatusCode = caught.value.code()
    return code


def test_member_reading_another_member_s_record_gets_404(
    client: httpx.Client, stack: Stack, channels: dict[str, grpc.Channel]
) -> None:
    admin = signup(client)
    alice_session, bob_session = _member(client, admin), _member(client, admin)
    alice = Caller(stack, channels, alice_session.access_token)
    bob = Caller(stack, channels, bob_session.access_token)
    boss = Caller(stack, channels, admin.access_token)
    assert alice.principal.role == common_pb2.ROLE_MEMBER

    record = alice.create("person", {"firstName": "Alice's contact"})
    assert record["ownerId"] == alice_session.user_id
    assert alice.get("person", record["id"])["id"] == record["id"]
    assert _code(lambda: bob.get("person", record["id"])) == grpc.StatusCode.NOT_FOUND
    assert record["id"] not in bob.ids("people")
    # The Admin sees every record of the workspace.
    assert boss.get("person", record["id"])["ownerId"] == alice_session.user_id


def test_custom_role_without_write_gets_403_naming_action_and_object(
    client: httpx.Client, stack: Stack, channels: dict[str, grpc.Channel]
) -> None:
    admin = signup(client)
    role = graphql_data(
        client,
        admin.access_token,
        """mutation { createRole(input: {name: "Readers",
             permissions: [{object: "person", actions: [READ]}]}) { id } }""",
    )["createRole"]
    reader = Caller(stack, channels, _member(client, admin, role["id"]).access_token)
    existing = Caller(stack, channels, admin.access_token).create("person", {"firstName": "X"})
    assert reader.get("person", existing["id"])["id"] == existing["id"]
    with pytest.raises(grpc.RpcError) as caught:
        reader.create("person", {"firstName": "Nope"})
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "WRITE" in (caught.value.details() or "")
    assert "person" in (caught.value.details() or "")
    denied = _code(lambda: reader.ids("companies"))
    assert denied == grpc.StatusCode.PERMISSION_DENIED


def test_api_key_with_a_role_is_enforced_the_same_way(
    client: httpx.Client, stack: Stack, channels: dict[str, grpc.Channel]
) -> None:
    admin = signup(client)
    role = graphql_data(
        client,
        admin.access_token,
        """mutation { createRole(input: {name: "Company readers",
             permissions: [{object: "company", actions: [READ]}]}) { id } }""",
    )["createRole"]
    token = graphql_data(
        client,
        admin.access_token,
        'mutation($r: UUID) { createApiKey(input: {name: "ro", roleId: $r}) { token } }',
        {"r": role["id"]},
    )["createApiKey"]["token"]
    key = Caller(stack, channels, token)
    assert key.principal.kind == common_pb2.PRINCIPAL_KIND_API_KEY
    assert key.ids("companies") == set()
    assert _code(lambda: key.create("company", {"name": "Acme"})) == (
        grpc.StatusCode.PERMISSION_DENIED
    )


def test_other_workspaces_records_are_invisible(
    client: httpx.Client, stack: Stack, channels: dict[str, grpc.Channel]
) -> None:
    owner = Caller(stack, channels, signup(client).access_token)
    intruder = Caller(stack, channels, signup(client).access_token)
    record = owner.create("company", {"name": "Secret Corp"})
    assert _code(lambda: intruder.get("company", record["id"])) == grpc.StatusCode.NOT_FOUND
    assert record["id"] not in intruder.ids("companies")


def test_signup_provisions_the_standard_objects(
    client: httpx.Client, stack: Stack, channels: dict[str, grpc.Channel]
) -> None:
    from crm.metadata.v1 import metadata_pb2, metadata_pb2_grpc
    from crmkit.principal import system_principal

    session = signup(client)
    metadata = metadata_pb2_grpc.MetadataServiceStub(
        grpc.insecure_channel(stack.grpc_address("metadata"))
    )
    schema = metadata.GetWorkspaceSchema(
        metadata_pb2.GetWorkspaceSchemaRequest(workspace_id=session.workspace_id),
        metadata=PrincipalCodec(stack.env["APP_SECRET"]).metadata(
            system_principal(session.workspace_id)
        ),
    )
    names = {item.name_singular for item in schema.objects}
    assert {"person", "company", "opportunity", "activity"} <= names


def test_issued_login_and_file_tokens_have_their_lifetimes(
    client: httpx.Client, stack: Stack, channels: dict[str, grpc.Channel]
) -> None:
    import jwt
    from google.protobuf import empty_pb2

    session = signup(client)
    caller = Caller(stack, channels, session.access_token)
    codec = PrincipalCodec(stack.env["APP_SECRET"])
    auth = identity_pb2_grpc.AuthServiceStub(channels["identity"])
    kinds = identity_pb2.IssueTokenRequest
    for kind, subject, lifetime, token_type in (
        (kinds.TOKEN_TYPE_LOGIN, "", 15 * 60, "login"),
        (kinds.TOKEN_TYPE_FILE, "7f1f5f0e-0000-4000-8000-000000000001", 86400, "file"),
    ):
        issued = auth.IssueToken(
            identity_pb2.IssueTokenRequest(type=kind, subject=subject),
            metadata=codec.metadata(caller.principal),
        )
        assert issued.expires_in == lifetime
        claims = jwt.decode(issued.token, stack.env["APP_SECRET"], algorithms=["HS256"])
        assert claims["type"] == token_type
        assert claims["sub"] == session.user_id
        assert claims["exp"] - claims["iat"] == lifetime
        if subject:
            assert claims["jti"] == subject
    # Without a principal identity refuses: these are not public calls.
    with pytest.raises(grpc.RpcError) as caught:
        auth.GetCurrentUser(empty_pb2.Empty())
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED

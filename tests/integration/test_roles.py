"""Members and roles: Admin-only management, built-in Admin and Member, custom roles, changes
effective at once for live sessions, and ids of other workspaces rejected everywhere."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from crmstack.client import Session, graphql, graphql_data, login, signup, unique_email

ADD = """mutation($input: AddWorkspaceMemberInput!) {
  addWorkspaceMember(input: $input) { id email firstName lastName roleId roleName createdAt }
}"""
CHANGE = """mutation($input: UpdateWorkspaceMemberRoleInput!) {
  updateWorkspaceMemberRole(input: $input) { id roleId roleName }
}"""
REMOVE = "mutation($id: UUID!) { removeWorkspaceMember(userId: $id) }"
CREATE_ROLE = """mutation($input: CreateRoleInput!) {
  createRole(input: $input) { id name description isBuiltin flags
    permissions { object actions ownRecordsOnly } }
}"""
UPDATE_ROLE = """mutation($input: UpdateRoleInput!) {
  updateRole(input: $input) { id name flags permissions { object actions } }
}"""
DELETE_ROLE = "mutation($id: UUID!) { deleteRole(id: $id) }"
ROLES = "{ roles { id name isBuiltin permissions { object actions ownRecordsOnly } flags } }"
WHO = "{ currentUser { id role kind flags permissions { object actions ownRecordsOnly } } }"
PASSWORD = "member password"


def _error(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert body.get("errors"), response.text
    error: dict[str, Any] = body["errors"][0]
    return error


def _add_member(
    client: httpx.Client, admin: Session, role_id: str | None = None, email: str | None = None
) -> Session:
    email = email or unique_email("member")
    member = graphql_data(
        client,
        admin.access_token,
        ADD,
        {
            "input": {
                "email": email,
                "password": PASSWORD,
                "firstName": "Mem",
                "lastName": "Ber",
                "roleId": role_id,
            }
        },
    )["addWorkspaceMember"]
    assert member["email"] == email
    return login(client, email, PASSWORD, admin.workspace_id)


def _roles(client: httpx.Client, session: Session) -> dict[str, dict[str, Any]]:
    return {
        role["name"]: role for role in graphql_data(client, session.access_token, ROLES)["roles"]
    }


@pytest.fixture
def admin(client: httpx.Client) -> Session:
    return signup(client)


def test_builtin_roles(client: httpx.Client, admin: Session) -> None:
    roles = _roles(client, admin)
    assert set(roles) == {"Admin", "Member"}
    assert roles["Admin"]["isBuiltin"]
    assert roles["Member"]["isBuiltin"]
    assert roles["Member"]["permissions"] == [
        {"object": "*", "actions": ["READ", "WRITE", "DELETE"], "ownRecordsOnly": True}
    ]
    assert roles["Member"]["flags"] == []


def test_added_member_is_a_member_by_default(client: httpx.Client, admin: Session) -> None:
    member = _add_member(client, admin)
    who = graphql_data(client, member.access_token, WHO)["currentUser"]
    assert who["role"] == "Member"
    assert who["flags"] == []
    assert who["permissions"] == [
        {"object": "*", "actions": ["READ", "WRITE", "DELETE"], "ownRecordsOnly": True}
    ]
    members = graphql_data(client, admin.access_token, "{ workspaceMembers { id roleName } }")
    assert {m["id"]: m["roleName"] for m in members["workspaceMembers"]} == {
        admin.user_id: "Admin",
        member.user_id: "Member",
    }


def test_duplicate_email_in_a_workspace_is_400_naming_email(
    client: httpx.Client, admin: Session
) -> None:
    member = _add_member(client, admin)
    response = graphql(
        client,
        admin.access_token,
        ADD,
        {"input": {"email": member.email.upper(), "password": PASSWORD}},
    )
    assert _error(response)["extensions"] == {"code": "BAD_USER_INPUT", "field": "email"}
    owner_again = graphql(
        client, admin.access_token, ADD, {"input": {"email": admin.email, "password": PASSWORD}}
    )
    assert _error(owner_again)["extensions"]["field"] == "email"


@pytest.mark.parametrize(
    ("change", "field"),
    [({"email": "nope"}, "email"), ({"password": "short"}, "password")],
)
def test_add_member_validates(
    client: httpx.Client, admin: Session, change: dict[str, str], field: str
) -> None:
    data = {"email": unique_email(), "password": PASSWORD, **change}
    response = graphql(client, admin.access_token, ADD, {"input": data})
    assert _error(response)["extensions"] == {"code": "BAD_USER_INPUT", "field": field}


def test_members_cannot_manage_members_or_roles(client: httpx.Client, admin: Session) -> None:
    member = _add_member(client, admin)
    attempts: list[tuple[str, dict[str, Any]]] = [
        (ADD, {"input": {"email": unique_email(), "password": PASSWORD}}),
        (
            CHANGE,
            {"input": {"userId": member.user_id, "roleId": _roles(client, admin)["Admin"]["id"]}},
        ),
        (REMOVE, {"id": admin.user_id}),
        (CREATE_ROLE, {"input": {"name": "Sneaky"}}),
        (
            """mutation { createOAuthClient(input: {name: "x",
                 redirectUris: ["https://example.com/cb"], scopes: ["*"]}) { id } }""",
            {},
        ),
    ]
    for query, variables in attempts:
        error = _error(graphql(client, member.access_token, query, variables))
        assert error["extensions"]["code"] == "FORBIDDEN", error
        assert "permission denied" in error["message"]


def test_role_change_takes_effect_on_live_sessions(client: httpx.Client, admin: Session) -> None:
    member = _add_member(client, admin)
    roles = _roles(client, admin)
    changed = graphql_data(
        client,
        admin.access_token,
        CHANGE,
        {"input": {"userId": member.user_id, "roleId": roles["Admin"]["id"]}},
    )["updateWorkspaceMemberRole"]
    assert changed["roleName"] == "Admin"
    # The same access token, without logging in again, now carries the Admin role.
    who = graphql_data(client, member.access_token, WHO)["currentUser"]
    assert who["role"] == "Admin"
    assert who["permissions"][0]["ownRecordsOnly"] is False
    graphql_data(client, member.access_token, "{ apiKeys { id } }")


def test_custom_role_lifecycle(client: httpx.Client, admin: Session) -> None:
    role = graphql_data(
        client,
        admin.access_token,
        CREATE_ROLE,
        {
            "input": {
                "name": "Sales",
                "description": "Sales team",
                "permissions": [
                    {"object": "person", "actions": ["READ", "WRITE"]},
                    {"object": "company", "actions": ["READ"]},
                    {"object": "person", "actions": ["DELETE"]},
                ],
                "flags": ["API_KEYS_AND_WEBHOOKS"],
            }
        },
    )["createRole"]
    assert role["isBuiltin"] is False
    assert role["flags"] == ["API_KEYS_AND_WEBHOOKS"]
    assert role["permissions"] == [
        {"object": "person", "actions": ["READ", "WRITE", "DELETE"], "ownRecordsOnly": False},
        {"object": "company", "actions": ["READ"], "ownRecordsOnly": False},
    ]
    member = _add_member(client, admin, role_id=role["id"])
    who = graphql_data(client, member.access_token, WHO)["currentUser"]
    assert who["role"] == "Sales"
    assert who["flags"] == ["API_KEYS_AND_WEBHOOKS"]
    # With the flag, the custom role manages API keys (for its own role only).
    graphql_data(client, member.access_token, "{ apiKeys { id } }")

    updated = graphql_data(
        client,
        admin.access_token,
        UPDATE_ROLE,
        {
            "input": {
                "id": role["id"],
                "name": "Sales EU",
                "permissions": [{"object": "opportunity", "actions": ["READ"]}],
                "flags": [],
            }
        },
    )["updateRole"]
    assert updated["name"] == "Sales EU"
    assert updated["permissions"] == [{"object": "opportunity", "actions": ["READ"]}]
    who = graphql_data(client, member.access_token, WHO)["currentUser"]
    assert who["role"] == "Sales EU"
    assert who["permissions"] == [
        {"object": "opportunity", "actions": ["READ"], "ownRecordsOnly": False}
    ]
    assert who["flags"] == []
    denied = graphql(client, member.access_token, "{ apiKeys { id } }")
    assert _error(denied)["extensions"]["code"] == "FORBIDDEN"

    in_use = graphql(client, admin.access_token, DELETE_ROLE, {"id": role["id"]})
    assert _error(in_use)["extensions"] == {"code": "BAD_USER_INPUT", "field": "id"}
    graphql_data(
        client,
        admin.access_token,
        CHANGE,
        {"input": {"userId": member.user_id, "roleId": _roles(client, admin)["Member"]["id"]}},
    )
    assert graphql_data(client, admin.access_token, DELETE_ROLE, {"id": role["id"]}) == {
        "deleteRole": role["id"]
    }
    assert "Sales EU" not in _roles(client, admin)


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"name": ""}, "name"),
        ({"name": "Admin"}, "name"),
        ({"name": "X", "permissions": [{"object": "no spaces", "actions": ["READ"]}]}, None),
        ({"name": "X", "permissions": [{"object": "person", "actions": []}]}, None),
    ],
)
def test_role_input_is_validated(
    client: httpx.Client, admin: Session, data: dict[str, Any], field: str | None
) -> None:
    error = _error(graphql(client, admin.access_token, CREATE_ROLE, {"input": data}))
    assert error["extensions"]["code"] == "BAD_USER_INPUT"
    if field is not None:
        assert error["extensions"]["field"] == field
    else:
        assert error["extensions"]["field"].startswith("permissions[0].")


def test_role_names_are_unique(client: httpx.Client, admin: Session) -> None:
    graphql_data(client, admin.access_token, CREATE_ROLE, {"input": {"name": "Ops"}})
    error = _error(graphql(client, admin.access_token, CREATE_ROLE, {"input": {"name": "ops"}}))
    assert error["extensions"] == {"code": "BAD_USER_INPUT", "field": "name"}


def test_builtin_roles_cannot_change(client: httpx.Client, admin: Session) -> None:
    roles = _roles(client, admin)
    for role in roles.values():
        update = graphql(
            client, admin.access_token, UPDATE_ROLE, {"input": {"id": role["id"], "name": "Boss"}}
        )
        assert _error(update)["extensions"] == {"code": "BAD_USER_INPUT", "field": "id"}
        delete = graphql(client, admin.access_token, DELETE_ROLE, {"id": role["id"]})
        assert _error(delete)["extensions"]["code"] == "BAD_USER_INPUT"


def test_workspace_keeps_an_admin(client: httpx.Client, admin: Session) -> None:
    roles = _roles(client, admin)
    demote = graphql(
        client,
        admin.access_token,
        CHANGE,
        {"input": {"userId": admin.user_id, "roleId": roles["Member"]["id"]}},
    )
    assert _error(demote)["extensions"]["code"] == "BAD_USER_INPUT"
    remove = graphql(client, admin.access_token, REMOVE, {"id": admin.user_id})
    assert _error(remove)["extensions"]["code"] == "BAD_USER_INPUT"


def test_removed_member_is_logged_out_at_once(client: httpx.Client, admin: Session) -> None:
    member = _add_member(client, admin)
    graphql_data(client, member.access_token, WHO)
    assert graphql_data(client, admin.access_token, REMOVE, {"id": member.user_id}) == {
        "removeWorkspaceMember": member.user_id
    }
    response = graphql(client, member.access_token, WHO)
    assert response.status_code == 401
    relogin = client.post(
        "/auth/login",
        json={"email": member.email, "password": PASSWORD, "workspaceId": admin.workspace_id},
        headers={"X-Forwarded-For": "198.51.100.7"},
    )
    assert relogin.status_code == 401


def test_other_workspace_ids_are_not_found(client: httpx.Client, admin: Session) -> None:
    other = signup(client)
    other_member = _add_member(client, other)
    other_roles = _roles(client, other)
    custom = graphql_data(client, other.access_token, CREATE_ROLE, {"input": {"name": "Theirs"}})[
        "createRole"
    ]
    own_roles = _roles(client, admin)
    attempts: list[tuple[str, dict[str, Any], str]] = [
        (
            CHANGE,
            {"input": {"userId": other_member.user_id, "roleId": own_roles["Admin"]["id"]}},
            "userId",
        ),
        (
            CHANGE,
            {"input": {"userId": admin.user_id, "roleId": other_roles["Admin"]["id"]}},
            "roleId",
        ),
        (REMOVE, {"id": other_member.user_id}, "userId"),
        (UPDATE_ROLE, {"input": {"id": custom["id"], "name": "Mine"}}, "id"),
        (DELETE_ROLE, {"id": custom["id"]}, "id"),
        ("query($id: UUID!) { role(id: $id) { id } }", {"id": custom["id"]}, "id"),
        (
            ADD,
            {"input": {"email": unique_email(), "password": PASSWORD, "roleId": custom["id"]}},
            "roleId",
        ),
    ]
    for query, variables, field in attempts:
        error = _error(graphql(client, admin.access_token, query, variables))
        assert error["extensions"] == {"code": "NOT_FOUND", "field": field}, (query, error)
    # Nothing changed on the other side.
    who = graphql_data(client, other_member.access_token, WHO)["currentUser"]
    assert who["role"] == "Member"
    assert "Theirs" in _roles(client, other)


def test_bad_ids_are_400(client: httpx.Client, admin: Session) -> None:
    response = graphql(client, admin.access_token, 'mutation { deleteRole(id: "not-a-uuid") }')
    assert _error(response)["extensions"]["code"] == "BAD_USER_INPUT"

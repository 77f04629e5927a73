"""Relation writes respect read access: `connect` needs READ on the target (and ownership for
own-records-only roles), and a merge re-points only records the caller may update."""

from __future__ import annotations

from typing import Any

import httpx

from crmstack.client import Session, graphql_data, login, unique_email
from tests.integration.api_helpers import Api

ADD = "mutation($input: AddWorkspaceMemberInput!) { addWorkspaceMember(input: $input) { id } }"
CREATE_ROLE = "mutation($input: CreateRoleInput!) { createRole(input: $input) { id } }"
PASSWORD = "member password"


def _member(client: httpx.Client, admin: Session, role_id: str | None = None) -> Api:
    email = unique_email("member")
    graphql_data(
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
    )
    return Api(client, login(client, email, PASSWORD, admin.workspace_id))


def _role(client: httpx.Client, admin: Session, permissions: list[dict[str, Any]]) -> str:
    role_id: str = graphql_data(
        client,
        admin.access_token,
        CREATE_ROLE,
        {"input": {"name": f"role {unique_email()}", "permissions": permissions}},
    )["createRole"]["id"]
    return role_id


def test_connect_needs_read_on_the_target_object(client: httpx.Client) -> None:
    admin = Api.signup(client)
    company = admin.create("companies", {"name": "Hidden"})
    role = _role(client, admin.session, [{"object": "person", "actions": ["READ", "WRITE"]}])
    people_only = _member(client, admin.session, role)
    missing = "00000000-0000-4000-8000-000000000000"
    for target in (company["id"], missing):  # same answer: the id's existence stays unknown
        body = people_only.bad(
            "POST", "/rest/people", 403, json={"firstName": "x", "company": {"connect": target}}
        )
        assert body["details"]["field"] == "company", body
        assert "READ on company" in body["message"]
    person = people_only.create("people", {"firstName": "Plain"})
    body = people_only.bad(
        "PATCH", f"/rest/people/{person['id']}", 403, json={"companyId": company["id"]}
    )
    assert body["details"]["field"] == "company"
    assert admin.ok("GET", f"/rest/people/{person['id']}")["data"]["companyId"] is None


def test_a_member_connects_only_to_records_it_owns(client: httpx.Client) -> None:
    admin = Api.signup(client)
    admins_company = admin.create("companies", {"name": "Admin's"})
    member = _member(client, admin.session)
    own_company = member.create("companies", {"name": "Mine"})
    missing = "00000000-0000-4000-8000-000000000000"
    answers = []
    for target in (admins_company["id"], missing):
        answers.append(
            member.bad(
                "POST", "/rest/people", json={"firstName": "x", "company": {"connect": target}}
            )
        )
    # Another owner's record answers exactly like one that does not exist.
    assert answers[0]["details"] == answers[1]["details"]
    assert answers[0]["details"]["field"] == "company"
    person = member.create("people", {"firstName": "Ok", "company": {"connect": own_company["id"]}})
    assert person["companyId"] == own_company["id"]
    member.bad("PATCH", f"/rest/people/{person['id']}", json={"companyId": admins_company["id"]})
    assert admin.ok("GET", f"/rest/people/{person['id']}")["data"]["companyId"] == own_company["id"]
    people = admin.ok("GET", "/rest/people")["data"]
    assert [p["firstName"] for p in people] == ["Ok"]


def test_a_member_merge_never_repoints_records_it_may_not_update(client: httpx.Client) -> None:
    admin = Api.signup(client)
    member = _member(client, admin.session)
    source = member.create("companies", {"name": "Source"})
    target = member.create("companies", {"name": "Target"})
    admins_person = admin.create(
        "people", {"firstName": "Admin's", "company": {"connect": source["id"]}}
    )
    body = member.bad(
        "PATCH",
        "/rest/companies/merge",
        403,
        json={"sourceId": source["id"], "targetId": target["id"]},
    )
    assert "1 person" in body["message"], body
    # Nothing changed: the source stands and the admin's person still points at it.
    assert member.ok("GET", f"/rest/companies/{source['id']}")["data"]["deletedAt"] is None
    person = admin.ok("GET", f"/rest/people/{admins_person['id']}")["data"]
    assert person["companyId"] == source["id"]
    # With only its own records pointing at the source, the member's merge goes through.
    admin.ok("PATCH", f"/rest/people/{admins_person['id']}", json={"companyId": None})
    mine = member.create("people", {"firstName": "Mine", "company": {"connect": source["id"]}})
    merged = member.ok(
        "PATCH",
        "/rest/companies/merge",
        json={"sourceId": source["id"], "targetId": target["id"]},
    )
    assert merged["meta"]["relationsRepointed"] == 1
    assert member.ok("GET", f"/rest/people/{mine['id']}")["data"]["companyId"] == target["id"]


def test_connect_through_graphql_is_refused_the_same_way(client: httpx.Client) -> None:
    admin = Api.signup(client)
    company = admin.create("companies", {"name": "Hidden"})
    member = _member(client, admin.session)
    error = member.error(
        """mutation($company: UUID!) {
             createPerson(data: {firstName: "x", company: {connect: $company}}) { id } }""",
        {"company": company["id"]},
    )
    assert error["extensions"]["code"] == "BAD_USER_INPUT", error
    assert admin.ok("GET", "/rest/people")["data"] == []

"""Helpers for the REST and GraphQL API tests: a signed-up workspace and calls on its behalf."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from crmstack.client import Session, signup

Record = dict[str, Any]


@dataclass
class Api:
    """A fresh workspace (POST /auth/signup) and its admin's token."""

    http: httpx.Client
    session: Session

    @classmethod
    def signup(cls, http: httpx.Client) -> Api:
        return cls(http, signup(http))

    @property
    def headers(self) -> dict[str, str]:
        return self.session.headers

    # -- REST ---------------------------------------------------------------------------------

    def rest(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return self.http.request(method, path, headers=self.headers, **kwargs)

    def ok(self, method: str, path: str, status: int = 200, **kwargs: Any) -> Any:
        response = self.rest(method, path, **kwargs)
        assert response.status_code == status, (method, path, response.status_code, response.text)
        assert response.headers["content-type"].startswith("application/json")
        return response.json()

    def create(self, plural: str, record: Record) -> Record:
        data: Record = self.ok("POST", f"/rest/{plural}", 201, json=record)["data"]
        return data

    def bad(self, method: str, path: str, status: int = 400, **kwargs: Any) -> Record:
        """A failing call: the spec's error body, returned for checking the field."""
        response = self.rest(method, path, **kwargs)
        assert response.status_code == status, (method, path, response.status_code, response.text)
        body: Record = response.json()
        assert set(body) == {"statusCode", "message", "error", "details"}, body
        assert body["statusCode"] == status
        assert set(body["details"]) == {"field", "message"}
        return body

    # -- GraphQL ------------------------------------------------------------------------------

    def graphql(
        self, query: str, variables: dict[str, Any] | None = None, *, path: str = "/graphql"
    ) -> Record:
        response = self.http.post(
            path, json={"query": query, "variables": variables or {}}, headers=self.headers
        )
        assert response.status_code == 200, response.text
        body: Record = response.json()
        return body

    def data(
        self, query: str, variables: dict[str, Any] | None = None, *, path: str = "/graphql"
    ) -> Record:
        body = self.graphql(query, variables, path=path)
        assert not body.get("errors"), body
        data: Record = body["data"]
        return data

    def error(
        self, query: str, variables: dict[str, Any] | None = None, *, path: str = "/graphql"
    ) -> Record:
        """The single error of a failing GraphQL call."""
        body = self.graphql(query, variables, path=path)
        assert body.get("errors"), body
        assert len(body["errors"]) == 1, body
        error: Record = body["errors"][0]
        return error

    # -- metadata -----------------------------------------------------------------------------

    def object_id(self, name: str) -> str:
        data = self.data("{ objects { edges { node { id nameSingular } } } }", path="/metadata")
        for edge in data["objects"]["edges"]:
            if edge["node"]["nameSingular"] == name:
                object_id: str = edge["node"]["id"]
                return object_id
        raise AssertionError(f"no object {name}")

    def create_object(self, singular: str, plural: str) -> str:
        data = self.data(
            """mutation($input: CreateObjectInput!) { createObject(input: $input) {
                 id nameSingular namePlural } }""",
            {
                "input": {
                    "nameSingular": singular,
                    "namePlural": plural,
                    "labelSingular": singular.title(),
                    "labelPlural": plural.title(),
                }
            },
            path="/metadata",
        )
        object_id: str = data["createObject"]["id"]
        return object_id

    def create_field(self, object_id: str, name: str, field_type: str, **extra: Any) -> Record:
        data = self.data(
            """mutation($input: CreateFieldInput!) { createField(input: $input) {
                 id name label type } }""",
            {
                "input": {
                    "objectMetadataId": object_id,
                    "name": name,
                    "label": name.title(),
                    "type": field_type,
                    **extra,
                }
            },
            path="/metadata",
        )
        field: Record = data["createField"]
        return field

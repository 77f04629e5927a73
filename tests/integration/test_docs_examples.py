"""Every curl and GraphQL example of README.md and docs/*.md runs as written against the stack.

The examples are found by tests/integration/docs_examples.py (its docstring has the rules: which
blocks run, which are skipped and why). Placeholders in them (`$BASE`, `$TOKEN`, ids such as
`01a2...`, cursors, `"..."` arguments, `<workflow id>`) are filled from records this module
creates; curl runs through bash exactly as written otherwise.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import httpx
import orjson
import pytest
from graphql import (
    ArgumentNode,
    DocumentNode,
    FieldNode,
    ListValueNode,
    ObjectFieldNode,
    ObjectValueNode,
    OperationDefinitionNode,
    OperationType,
    StringValueNode,
    ValueNode,
    parse,
    print_ast,
)

from crmstack.client import signup
from tests.integration.api_helpers import Api
from tests.integration.docs_examples import (
    NOT_API_PROGRAMS,
    Example,
    documented_keys,
    documented_shape,
    examples,
    shape_mismatches,
)
from tests.integration.workflows_client import running_receiver

EXAMPLES = examples()
PASSWORD = "docs-example-password"
# `"..."` arguments of the auth examples: what each one stands for (field, argument).
FRESH = {
    ("deleteApiKey", "id"): "apiKey",
    ("deletePersonalAccessToken", "id"): "personalAccessToken",
    ("updateRole", "id"): "role",
    ("deleteRole", "id"): "role",
    ("addWorkspaceMember", "roleId"): "role",
    ("updateWorkspaceMemberRole", "roleId"): "role",
    ("updateWorkspaceMemberRole", "userId"): "member",
    ("removeWorkspaceMember", "userId"): "member",
    ("addWorkspaceMember", "password"): "password",
}


class Placeholders:
    """The workspace the examples run in and the values their placeholders stand for."""

    def __init__(self, client: httpx.Client, base_url: str, receiver_url: str) -> None:
        self.client = client
        self.base_url = base_url
        self.receiver_url = receiver_url
        self.api = Api.signup(client)
        self.suffix = secrets.token_hex(4)
        api = self.api
        acme = api.create("companies", {"name": "Acme", "website": "acme.test"})
        source = api.create("companies", {"name": "Acme GmbH"})
        target = api.create("companies", {"name": "Acme Inc", "website": "acme.test"})
        ada = api.create(
            "people",
            {"firstName": "Ada", "lastName": "Lovelace", "email": "ada@acme.test",
             "companyId": acme["id"]},
        )  # fmt: skip
        api.create("people", {"firstName": "Alan", "lastName": "Turing", "companyId": source["id"]})
        api.create("people", {"firstName": "Grace", "lastName": "Hopper"})
        for stage, amount in (("WON", 15_000), ("WON", 20_000), ("LOST", 7_000)):
            api.create(
                "opportunities",
                {"name": f"Deal {stage}", "stage": stage, "closeDate": "2026-03-01",
                 "amount": amount, "companyId": acme["id"]},
            )  # fmt: skip
        first_page = api.ok("GET", "/rest/people", params={"limit": 2})
        self.text = {
            "01a2...": ada["id"],
            "01a1...": acme["id"],
            "01b...": source["id"],
            "01a...": target["id"],
            "WyJpZDpBIi...": first_page["pageInfo"]["endCursor"],
        }
        self.captured: dict[str, str] = {}

    def substitute(self, text: str) -> str:
        for placeholder, value in self.text.items():
            text = text.replace(placeholder, value)
        text = re.sub(r"\b([a-z]+)@example\.com", rf"\1-{self.suffix}@example.com", text)
        text = text.replace("localhost:3000", self.base_url)
        text = text.replace("https://chat.example.com", self.receiver_url)  # a workflow's target
        while '"refreshToken": "..."' in text:  # each its own session
            fresh = signup(self.client).refresh_token
            text = text.replace('"refreshToken": "..."', f'"refreshToken": "{fresh}"', 1)
        return text

    def fresh(self, kind: str) -> str:
        """A new value for one `"..."` argument of the auth examples."""
        if kind == "password":
            return PASSWORD
        if kind == "apiKey":
            return str(self.api.data('mutation { createApiKey(input: {name: "x"}) { id } }')[
                "createApiKey"]["id"])  # fmt: skip
        if kind == "personalAccessToken":
            query = 'mutation { createPersonalAccessToken(input: {name: "x"}) { id } }'
            return str(self.api.data(query)["createPersonalAccessToken"]["id"])
        if kind == "role":
            name = f"Role {secrets.token_hex(3)}"
            query = "mutation($n: String!) { createRole(input: {name: $n, permissions: []}) {id} }"
            return str(self.api.data(query, {"n": name})["createRole"]["id"])
        assert kind == "member", kind
        query = """mutation($e: String!, $p: String!) { addWorkspaceMember(input: {email: $e,
            password: $p, firstName: "M", lastName: "M"}) { id } }"""
        email = f"member-{secrets.token_hex(4)}@example.com"
        return str(self.api.data(query, {"e": email, "p": PASSWORD})["addWorkspaceMember"]["id"])

    def variable(self, name: str) -> str:
        """`$pet: UUID!` is the id of the object `pet`."""
        return self.api.object_id(name)


@pytest.fixture(scope="module")
def placeholders(client: httpx.Client, base_url: str) -> Iterator[Placeholders]:
    with running_receiver() as receiver:
        yield Placeholders(client, base_url, receiver.url(""))


def _ids(example: Example) -> str:
    return f"{example.source}:{example.text.split(chr(10))[0][:50]}"


def test_every_shell_command_is_an_api_example_or_skipped_by_rule() -> None:
    """A shell command that is not curl must be one the rules leave out on purpose."""
    others = {e.program for e in EXAMPLES if e.kind == "other"}
    assert others <= NOT_API_PROGRAMS, others - NOT_API_PROGRAMS
    assert sum(e.kind == "curl" for e in EXAMPLES) >= 15
    assert sum(e.kind == "graphql" for e in EXAMPLES) >= 8


def _check_shape(example: Example, body: Any) -> None:
    if example.expected.shape is None:
        return
    documented = documented_shape(example.expected.shape)
    if documented is not None:
        problems = shape_mismatches(documented, body)
        assert not problems, (example.source, problems, body)
        return
    keys = documented_keys(example.expected.shape)
    assert keys, (example.source, example.expected.shape)
    assert isinstance(body, dict), (example.source, body)
    assert set(keys) <= set(body), (example.source, keys, body)


# Examples marked `<!-- docs-test: skip: why -->` (they need a local file, an id answered by an
# earlier call, ...) are documentation only: not collected, each checked for its reason below.
RUNNABLE = [e for e in EXAMPLES if e.skip_reason is None]
LEFT_OUT = [e for e in EXAMPLES if e.skip_reason is not None]


def test_examples_left_out_say_why_and_stay_few() -> None:
    for example in LEFT_OUT:
        assert len(example.skip_reason or "") >= 15, example.source
    assert len(LEFT_OUT) <= 12, [e.source for e in LEFT_OUT]  # the rule is to run examples


@pytest.mark.parametrize("example", [e for e in RUNNABLE if e.kind == "curl"], ids=_ids)
def test_curl_example_runs_as_written(example: Example, placeholders: Placeholders) -> None:
    curl = shutil.which("curl")
    assert curl, "curl is needed to run the documented examples"
    # Every curl call of the example prints its status on a last line; errors are shown.
    script = (
        f"curl() {{ {curl} --show-error --write-out '\\n%{{http_code}}' \"$@\"; }}\n"
        + placeholders.substitute(example.text)
    )
    env = {
        **os.environ,
        "BASE": placeholders.base_url,
        "TOKEN": placeholders.api.session.access_token,
    }
    result = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert result.returncode == 0, (example.source, result.returncode, result.stderr)
    text, _, status = result.stdout.rpartition("\n")
    if example.expected.status is not None:
        assert int(status) == example.expected.status, (example.source, status, text)
    else:
        assert 200 <= int(status) < 300, (example.source, status, text)
    if text.strip():
        _check_shape(example, orjson.loads(text))


def _operations(document: DocumentNode) -> Iterator[OperationDefinitionNode]:
    for definition in document.definitions:
        assert isinstance(definition, OperationDefinitionNode), definition
        yield definition


def _fill(value: ValueNode, field: str, name: str, placeholders: Placeholders) -> ValueNode:
    """`value` (of the argument or input field `name` under `field`) with placeholders filled."""
    if isinstance(value, StringValueNode):
        text = value.value
        if text == "...":
            kind = FRESH.get((field, name))
            assert kind is not None, f"no value known for {field}({name}: ...)"
            text = placeholders.fresh(kind)
        elif text.startswith("<") and text.endswith(">"):
            text = placeholders.captured[text]
        else:
            text = placeholders.substitute(text)
        return StringValueNode(value=text)
    if isinstance(value, ObjectValueNode):
        fields = (
            ObjectFieldNode(name=f.name, value=_fill(f.value, field, f.name.value, placeholders))
            for f in value.fields
        )
        return ObjectValueNode(fields=tuple(fields))
    if isinstance(value, ListValueNode):
        values = (_fill(v, field, name, placeholders) for v in value.values)
        return ListValueNode(values=tuple(values))
    return value


def _filled(operation: OperationDefinitionNode, placeholders: Placeholders) -> str:
    selections = []
    for selection in operation.selection_set.selections:
        assert isinstance(selection, FieldNode)
        arguments = tuple(
            ArgumentNode(
                name=a.name,
                value=_fill(a.value, selection.name.value, a.name.value, placeholders),
            )
            for a in selection.arguments or ()
        )
        selections.append(replace(selection, arguments=arguments))
    selection_set = replace(operation.selection_set, selections=tuple(selections))
    return print_ast(replace(operation, selection_set=selection_set))


@pytest.mark.parametrize("example", [e for e in RUNNABLE if e.kind == "graphql"], ids=_ids)
def test_graphql_example_runs_as_written(example: Example, placeholders: Placeholders) -> None:
    document = parse(placeholders.substitute(example.text))
    ran = 0
    for operation in _operations(document):
        if operation.operation is OperationType.SUBSCRIPTION:
            continue  # not over HTTP: test_subscriptions_*.py
        variables = {
            d.variable.name.value: placeholders.variable(d.variable.name.value)
            for d in operation.variable_definitions or ()
            if print_ast(d.type) == "UUID!"
        }
        body = placeholders.api.graphql(_filled(operation, placeholders), variables)
        assert not body.get("errors"), (example.source, print_ast(operation), body["errors"])
        assert body["data"], (example.source, body)
        workflow = body["data"].get("createWorkflow")
        if workflow:
            placeholders.captured["<workflow id>"] = workflow["id"]
        ran += 1
    assert ran, f"{example.source}: no operation to run"

"""GET /rest/open-api: an OpenAPI 3.1 document generated from the workspace's metadata, accurate
enough that schemathesis (bounded) finds no server error and no schema violation against it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import jsonschema_rs
import pytest
from schemathesis.specs.openapi.definitions import OPENAPI_31

from tests.integration.api_helpers import Api

# Examples per operation: about 60 operations; keeps the run to a minute or two on 2 cores.
SCHEMATHESIS_EXAMPLES = 6


@pytest.fixture(scope="module")
def api(client: httpx.Client) -> Api:
    """A workspace with a custom object holding every field type."""
    api = Api.signup(client)
    object_id = api.create_object("gizmo", "gizmos")
    for name, field_type in (
        ("serial", "UUID"),
        ("units", "NUMBER"),
        ("active", "BOOLEAN"),
        ("madeOn", "DATE"),
        ("seenAt", "DATE_TIME"),
        ("price", "CURRENCY"),
        ("contact", "EMAIL"),
        ("hotline", "PHONE"),
        ("homepage", "LINK"),
        ("extra", "RAW_JSON"),
    ):
        api.create_field(object_id, name, field_type)
    api.create_field(object_id, "grade", "SELECT", options=[{"value": "A"}, {"value": "B"}])
    api.create_field(object_id, "flags", "MULTI_SELECT", options=[{"value": "X"}, {"value": "Y"}])
    api.create_field(
        object_id,
        "maker",
        "RELATION",
        relation={"targetObjectName": "company", "inverseFieldName": "gizmos"},
    )
    return api


def test_document_is_valid_openapi_31_with_custom_objects(api: Api) -> None:
    document: dict[str, Any] = api.ok("GET", "/rest/open-api")
    assert document["openapi"] == "3.1.0"
    # The Rust validator: jsonschema's took 47 s on a 0.9 MB document ($dynamicRef).
    errors = sorted(jsonschema_rs.Draft202012Validator(OPENAPI_31).iter_errors(document), key=str)
    assert not errors, errors[:3]
    for name, schema in document["components"]["schemas"].items():
        jsonschema.Draft202012Validator.check_schema(schema), name
    paths = document["paths"]
    for plural in ("people", "companies", "opportunities", "activities", "tasks", "gizmos"):
        assert set(paths[f"/rest/{plural}"]) == {"get", "post"}
        assert set(paths[f"/rest/{plural}/{{id}}"]) == {"parameters", "get", "patch", "delete"}
        assert "post" in paths[f"/rest/batch/{plural}"]
        assert "post" in paths[f"/rest/{plural}/duplicates"]
        assert "patch" in paths[f"/rest/{plural}/merge"]
        assert "get" in paths[f"/rest/{plural}/groupBy"]
        assert "patch" in paths[f"/rest/restore/{plural}/{{id}}"]
    gizmo = document["components"]["schemas"]["Gizmo"]["properties"]
    assert gizmo["price"]["anyOf"] == [{"$ref": "#/components/schemas/Currency"}, {"type": "null"}]
    assert gizmo["makerId"]["format"] == "uuid"
    create = document["components"]["schemas"]["GizmoCreate"]
    assert create["additionalProperties"] is False
    assert create["properties"]["grade"]["enum"] == ["A", "B", None]
    assert document["components"]["schemas"]["CompanyCreate"]["required"] == ["name"]
    parameters = {p["name"] for p in paths["/rest/gizmos"]["get"]["parameters"]}
    assert {"filter[units][gte]", "filter[maker][id][eq]", "orderBy[seenAt]", "limit"} <= parameters


def test_every_write_operation_declares_the_idempotency_key_header(api: Api) -> None:
    document: dict[str, Any] = api.ok("GET", "/rest/open-api")
    header = document["components"]["parameters"]["Idempotency-Key"]
    assert (header["in"], header["required"], header["schema"]["maxLength"]) == (
        "header",
        False,
        255,
    )
    reference = {"$ref": "#/components/parameters/Idempotency-Key"}
    writes: list[tuple[str, str]] = []
    reads: list[tuple[str, str]] = []
    for path, item in document["paths"].items():
        for method, operation in item.items():
            if method == "parameters":
                continue
            takes_key = reference in operation.get("parameters", [])
            (writes if takes_key else reads).append((method, path))
            if takes_key:
                assert "422" in operation["responses"], (method, path)
    for plural in ("people", "gizmos"):
        assert {
            ("post", f"/rest/{plural}"),
            ("patch", f"/rest/{plural}/{{id}}"),
            ("delete", f"/rest/{plural}/{{id}}"),
            ("post", f"/rest/batch/{plural}"),
            ("patch", f"/rest/{plural}/merge"),
            ("patch", f"/rest/restore/{plural}/{{id}}"),
        } <= set(writes)
    # Reads (a duplicate search is a POST that writes nothing) do not take it.
    assert all(method == "get" or path.endswith("/duplicates") for method, path in reads), reads


def test_a_second_workspace_with_the_same_model_gets_the_same_document(
    client: httpx.Client,
) -> None:
    first, second = Api.signup(client), Api.signup(client)
    assert first.ok("GET", "/rest/open-api") == second.ok("GET", "/rest/open-api")


def test_schemathesis_finds_no_server_error_and_no_schema_violation(
    api: Api, base_url: str, tmp_path: Path
) -> None:
    command = [
        str(Path(sys.executable).parent / "schemathesis"),
        "run",
        f"{base_url}/rest/open-api",
        "--header",
        f"Authorization: Bearer {api.session.access_token}",
        "--checks",
        "not_a_server_error,status_code_conformance,content_type_conformance,"
        "response_schema_conformance",
        "--phases",
        "examples,fuzzing",
        "--max-examples",
        str(SCHEMATHESIS_EXAMPLES),
        "--workers",
        "2",
        "--request-timeout",
        "30",
        "--generation-database",
        "none",
        # Hypothesis' "too slow to generate data" check measures this machine's CPU (shared by
        # parallel jobs), not the API: the groupBy filter grammar is large but valid.
        "--suppress-health-check",
        "too_slow",
        "--no-color",
        "--report",
        "junit",
        "--report-dir",
        str(tmp_path),
    ]
    # In a temporary folder: schemathesis keeps a cache (.schemathesis/) in its working directory.
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=280, check=False, cwd=tmp_path
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-8000:]
    assert "Fuzzing" in output, output[-2000:]

"""The OpenAPI document generated from a data model."""

from __future__ import annotations

import jsonschema
import jsonschema_rs
from schemathesis.specs.openapi.definitions import OPENAPI_31

from gateway.datamodel.model import DataModel
from gateway.rest.openapi import build_document


def test_document_is_valid_openapi_31(model: DataModel) -> None:
    document = build_document(model)
    # The Rust validator: jsonschema's took 47 s on a 0.9 MB document ($dynamicRef).
    errors = list(jsonschema_rs.Draft202012Validator(OPENAPI_31).iter_errors(document))
    assert not errors, errors[:3]
    for schema in document["components"]["schemas"].values():
        jsonschema.Draft202012Validator.check_schema(schema)


def test_every_object_has_the_spec_table(model: DataModel) -> None:
    paths = build_document(model)["paths"]
    for obj in model.objects:
        p = obj.plural
        assert {
            f"/rest/{p}",
            f"/rest/{p}/{{id}}",
            f"/rest/batch/{p}",
            f"/rest/{p}/duplicates",
            f"/rest/{p}/merge",
            f"/rest/{p}/groupBy",
            f"/rest/restore/{p}/{{id}}",
        } <= set(paths)
    assert paths["/rest/pets"]["post"]["responses"]["201"]


def test_schemas_follow_the_fields(model: DataModel) -> None:
    schemas = build_document(model)["components"]["schemas"]
    person = schemas["Person"]["properties"]
    assert person["id"] == {"type": "string", "format": "uuid", "description": "Id"}
    assert person["companyId"]["type"] == ["string", "null"]
    assert person["company"]["anyOf"][0] == {"$ref": "#/components/schemas/Company"}
    assert person["opportunities"]["items"] == {"$ref": "#/components/schemas/Opportunity"}
    assert person["profile"] == {"description": "Profile"}  # RAW_JSON: any JSON
    assert "retired" not in person  # inactive
    company_create = schemas["CompanyCreate"]
    assert company_create["required"] == ["name"]
    assert company_create["additionalProperties"] is False
    assert "people" not in company_create["properties"]  # one-to-many: not writable
    assert "createdAt" not in company_create["properties"]
    opportunity = schemas["OpportunityCreate"]["properties"]
    assert opportunity["stage"]["enum"] == ["PROSPECTING", "QUALIFIED", "WON", "LOST"]
    assert opportunity["amount"]["anyOf"][0] == {"$ref": "#/components/schemas/CurrencyInput"}
    assert opportunity["company"] == {"$ref": "#/components/schemas/RelationInput"}
    assert "required" not in schemas["OpportunityUpdate"]


def test_list_parameters_offer_each_fields_operators(model: DataModel) -> None:
    get = build_document(model)["paths"]["/rest/people"]["get"]
    names = {parameter["name"]: parameter for parameter in get["parameters"]}
    assert "filter[firstName][startsWith]" in names
    assert "filter[vip][gt]" not in names  # booleans are not ordered
    assert names["filter[email][is]"]["schema"] == {"type": "string", "enum": ["null"]}
    assert names["filter[company][id][in]"]["style"] == "form"
    assert names["filter[tags][contains]"]["schema"]["items"]["enum"] == ["LEAD", "PARTNER"]
    assert "orderBy[company]" in names
    assert "orderBy[tags]" not in names
    assert names["limit"]["schema"]["maximum"] == 200
    assert names["depth"]["schema"]["maximum"] == 1
    assert "2:" not in names["depth"]["description"]
    assert "filter[company][name][startsWith]" in names  # a related record's own fields
    assert "filter[company][people][eq]" not in names
    assert names["filter"]["schema"] == {"type": "string", "contentMediaType": "application/json"}


def test_responses_document_the_rate_limit_headers(model: DataModel) -> None:
    document = build_document(model)
    responses = document["paths"]["/rest/people"]["get"]["responses"]
    assert set(responses["200"]["headers"]) == {
        "X-RateLimit-Limit",
        "X-RateLimit-Remaining",
        "X-RateLimit-Reset",
    }
    assert "Retry-After" in responses["429"]["headers"]
    assert "headers" not in responses["401"]
    assert set(document["components"]["headers"]) >= {"Retry-After", "X-RateLimit-Reset"}

"""Pure logic of the metadata service: names, standard objects, field definitions."""

from __future__ import annotations

import pytest

from crm.metadata.v1 import metadata_pb2 as md
from crmkit.errors import InvalidArgument
from metadata import definitions, names
from metadata.definitions import Definitions
from metadata.standard import standard_objects

WS = "11111111-2222-4333-8444-555555555555"


def defs() -> Definitions:
    return Definitions(WS, standard_objects(WS))


def object_id(d: Definitions, name: str) -> str:
    return next(o.id for o in d.objects if o.name_singular == name)


@pytest.mark.parametrize("name", ["Person", "first_name", "1abc", "a-b", "x" * 49, ""])
def test_bad_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        names.check_name(name, "name", reserved=names.RESERVED_FIELD_NAMES, what="a field")
    assert caught.value.field == "name"


def test_humanize() -> None:
    assert names.humanize("annualRecurringRevenue") == "Annual recurring revenue"


def test_standard_objects_are_deterministic_and_related_both_ways() -> None:
    first, second = standard_objects(WS), standard_objects(WS)
    assert [o.id for o in first] == [o.id for o in second]
    by_name = {o.name_singular: o for o in first}
    person_company = next(f for f in by_name["person"].fields if f.name == "company")
    assert person_company.relation.kind == md.RELATION_KIND_MANY_TO_ONE
    assert person_company.relation.target_object_metadata_id == by_name["company"].id
    people = next(f for f in by_name["company"].fields if f.name == "people")
    assert people.relation.kind == md.RELATION_KIND_ONE_TO_MANY
    for item in first:
        assert {"id", "ownerId", "createdAt", "updatedAt", "deletedAt"} <= {
            f.name for f in item.fields
        }


def test_new_relation_creates_both_sides_with_default_inverse() -> None:
    d = defs()
    created, rows = definitions.new_fields(
        d,
        md.CreateFieldRequest(
            object_metadata_id=object_id(d, "task"), name="opportunity",
            type=md.FIELD_TYPE_RELATION,
            relation=md.RelationSettings(target_object_name="opportunity"),
        ),
    )  # fmt: skip
    assert created.relation.kind == md.RELATION_KIND_MANY_TO_ONE
    assert [r.name for r in rows] == ["opportunity", "tasks"]
    assert rows[1].object_metadata_id == object_id(d, "opportunity")


def test_one_to_many_creation_puts_the_foreign_key_on_the_target() -> None:
    d = defs()
    created, rows = definitions.new_fields(
        d,
        md.CreateFieldRequest(
            object_metadata_id=object_id(d, "company"), name="staff", type=md.FIELD_TYPE_RELATION,
            relation=md.RelationSettings(
                kind=md.RELATION_KIND_ONE_TO_MANY, target_object_name="person",
                inverse_field_name="employer",
            ),
        ),
    )  # fmt: skip
    assert created.relation.kind == md.RELATION_KIND_ONE_TO_MANY
    many = rows[1]
    assert (many.name, many.object_metadata_id) == ("employer", object_id(d, "person"))


@pytest.mark.parametrize(
    ("request_fields", "field"),
    [
        ({"name": "company", "type": md.FIELD_TYPE_TEXT}, "name"),
        ({"name": "companyId", "type": md.FIELD_TYPE_TEXT}, "name"),
        ({"name": "x", "type": md.FIELD_TYPE_TEXT, "options": [md.SelectOption(value="A")]},
         "options"),
        ({"name": "x", "type": md.FIELD_TYPE_MULTI_SELECT,
          "options": [md.SelectOption(value="A"), md.SelectOption(value="A")]},
         "options[1].value"),
        ({"name": "x", "type": md.FIELD_TYPE_SELECT, "options": [md.SelectOption(value="A")],
          "default_value_json": b'"B"'}, "defaultValue"),
        ({"name": "x", "type": md.FIELD_TYPE_CURRENCY, "is_unique": True}, "isUnique"),
        ({"name": "x", "type": md.FIELD_TYPE_RELATION,
          "relation": md.RelationSettings(target_object_name="company",
                                          inverse_field_name="people")},
         "relation.inverseFieldName"),
    ],
)  # fmt: skip
def test_bad_field_definitions(request_fields: dict[str, object], field: str) -> None:
    d = defs()
    request = md.CreateFieldRequest(object_metadata_id=object_id(d, "person"), **request_fields)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument) as caught:
        definitions.new_fields(d, request)
    assert caught.value.field == field


def test_object_names_are_unique_across_singular_and_plural() -> None:
    d = defs()
    with pytest.raises(InvalidArgument) as caught:
        definitions.new_object(d, md.CreateObjectRequest(name_singular="people", name_plural="x"))
    assert caught.value.field == "nameSingular"
    created = definitions.new_object(
        d, md.CreateObjectRequest(name_singular="project", name_plural="projects")
    )
    assert created.label_singular == "Project"
    assert "name" in {f.name for f in created.fields}


def test_field_update_rules() -> None:
    d = defs()
    person = next(o for o in d.objects if o.name_singular == "person")
    system = next(f for f in person.fields if f.name == "id")
    with pytest.raises(InvalidArgument):
        definitions.apply_field_update(d, md.UpdateFieldRequest(id=system.id, label="x"))
    email = next(f for f in person.fields if f.name == "email")
    with pytest.raises(InvalidArgument) as caught:
        definitions.apply_field_update(d, md.UpdateFieldRequest(id=email.id, name="mail"))
    assert caught.value.field == "name"
    company = next(f for f in person.fields if f.name == "company")
    changed = definitions.apply_field_update(
        d, md.UpdateFieldRequest(id=company.id, is_active=False)
    )
    assert [(f.name, f.is_active) for f in changed] == [("company", False), ("people", False)]


def test_searchable_defaults_and_refusals() -> None:
    d = defs()
    person = {f.name: f.is_searchable for f in d.by_id[object_id(d, "person")].fields}
    assert [name for name, on in person.items() if on] == [
        "firstName",
        "lastName",
        "email",
        "phone",
        "jobTitle",
    ]
    people = object_id(d, "person")
    text, _ = definitions.new_fields(
        d,
        md.CreateFieldRequest(object_metadata_id=people, name="nickname", type=md.FIELD_TYPE_TEXT),
    )
    assert text.is_searchable
    number, _ = definitions.new_fields(
        d, md.CreateFieldRequest(object_metadata_id=people, name="score", type=md.FIELD_TYPE_NUMBER)
    )
    assert not number.is_searchable
    off, _ = definitions.new_fields(
        d,
        md.CreateFieldRequest(
            object_metadata_id=people, name="notes", type=md.FIELD_TYPE_TEXT, is_searchable=False
        ),
    )
    assert not off.is_searchable
    with pytest.raises(InvalidArgument) as caught:
        definitions.new_fields(
            d,
            md.CreateFieldRequest(
                object_metadata_id=people,
                name="rank",
                type=md.FIELD_TYPE_NUMBER,
                is_searchable=True,
            ),
        )
    assert caught.value.field == "isSearchable"


def test_indexed_defaults_and_refusals() -> None:
    d = defs()
    indexed = {
        o.name_singular: [f.name for f in o.fields if f.is_indexed and not f.is_system]
        for o in d.objects
    }
    assert indexed == {
        "person": ["firstName", "lastName", "email", "company"],
        "company": ["name", "website"],
        "opportunity": ["name", "amount", "stage", "closeDate", "company", "pointOfContact"],
        "activity": ["title", "type", "dueAt", "person", "company", "opportunity"],
        "task": ["title", "dueAt", "status", "person", "company"],
    }
    person = d.by_id[object_id(d, "person")]
    system = {f.name: f.is_indexed for f in person.fields if f.is_system}
    assert system == {
        "id": True, "ownerId": True, "createdAt": True, "updatedAt": True, "deletedAt": False
    }  # fmt: skip

    def create(name: str, kind: md.FieldType, **extra: object) -> md.FieldMetadata:
        request = md.CreateFieldRequest(object_metadata_id=person.id, name=name, type=kind)
        for key, value in extra.items():
            setattr(request, key, value)
        if kind == md.FIELD_TYPE_MULTI_SELECT:
            request.options.append(md.SelectOption(value="A"))
        return definitions.new_fields(d, request)[0]

    assert not create("nickname", md.FIELD_TYPE_TEXT).is_indexed
    assert create("badge", md.FIELD_TYPE_TEXT, is_unique=True).is_indexed
    assert create("score", md.FIELD_TYPE_NUMBER, is_indexed=True).is_indexed
    assert not create("code", md.FIELD_TYPE_TEXT, is_unique=True, is_indexed=False).is_indexed
    for kind in (md.FIELD_TYPE_BOOLEAN, md.FIELD_TYPE_MULTI_SELECT, md.FIELD_TYPE_RAW_JSON):
        with pytest.raises(InvalidArgument) as caught:
            create("flag", kind, is_indexed=True)
        assert caught.value.field == "isIndexed"
    fields = {f.name: f for f in person.fields}
    for name in ("company", "firstName"):  # a many-to-one relation, the label field
        with pytest.raises(InvalidArgument) as caught:
            definitions.apply_field_update(
                d, md.UpdateFieldRequest(id=fields[name].id, is_indexed=False)
            )
        assert caught.value.field == "isIndexed"
    (city,) = definitions.apply_field_update(
        d, md.UpdateFieldRequest(id=fields["city"].id, is_indexed=True)
    )
    assert city.is_indexed
    relabelled = definitions.apply_object_update(
        d, md.UpdateObjectRequest(id=person.id, label_identifier_field="jobTitle")
    )
    label = definitions.indexed_label(relabelled)
    assert label is not None
    assert label.name == "jobTitle"
    assert label.is_indexed
    assert definitions.indexed_label(person) is None
    company = d.by_id[object_id(d, "company")]
    flagged = definitions.apply_object_update(
        d, md.UpdateObjectRequest(id=company.id, label_identifier_field="idealCustomerProfile")
    )
    assert definitions.indexed_label(flagged) is None  # a boolean label: no btree to build

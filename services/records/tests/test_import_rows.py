"""Import rows prepared before the database sees them: the CSV plan of plain columns gives
exactly what the generic road (import_columns.csv_row, then inputs.prepare_create) gives, the
same column values or the same rejection, and leaves the columns it does not cover to it."""

from __future__ import annotations

import itertools
import uuid
from typing import Any

import orjson
import pytest

from crm.metadata.v1 import metadata_pb2 as md
from crmkit.authz import Access
from crmkit.errors import ServiceError
from records import import_columns, inputs
from records.import_rows import CsvPlan, RowPreparer
from records.import_source import CSV
from records.model import ObjectModel, WorkspaceModel

WS = "11111111-2222-4333-8444-555555555555"
OBJECT_ID = "aaaaaaaa-0000-4000-8000-000000000009"
OWNER = "cccccccc-0000-4000-8000-000000000001"


def _field(name: str, kind: md.FieldType, **extra: Any) -> md.FieldMetadata:
    settings: dict[str, Any] = {"is_active": True, "is_nullable": True, "label": name, **extra}
    return md.FieldMetadata(id=str(uuid.uuid4()), name=name, type=kind, **settings)


def _options(*values: str) -> list[md.SelectOption]:
    return [md.SelectOption(value=v, label=v) for v in values]


def _model() -> tuple[WorkspaceModel, ObjectModel]:
    fields = [
        _field("code", md.FIELD_TYPE_TEXT, is_unique=True),
        _field("email", md.FIELD_TYPE_EMAIL),
        _field("qty", md.FIELD_TYPE_NUMBER),
        _field("active", md.FIELD_TYPE_BOOLEAN),
        _field("madeOn", md.FIELD_TYPE_DATE),
        _field("seenAt", md.FIELD_TYPE_DATE_TIME),
        _field("stage", md.FIELD_TYPE_SELECT, options=_options("NEW", "WON")),
        _field("tags", md.FIELD_TYPE_MULTI_SELECT, options=_options("A", "B")),
        _field("extra", md.FIELD_TYPE_RAW_JSON),
        _field("ref", md.FIELD_TYPE_UUID),
        _field("title", md.FIELD_TYPE_TEXT, is_nullable=False),
        _field("tier", md.FIELD_TYPE_SELECT, options=_options("GOLD", "BASIC"),
               default_value_json=b'"BASIC"'),
        _field("note", md.FIELD_TYPE_TEXT),  # never in the file: null
    ]  # fmt: skip
    item = md.ObjectMetadata(
        id=OBJECT_ID, name_singular="item", name_plural="items", is_active=True, fields=fields
    )
    schema = md.WorkspaceSchema(workspace_id=WS, version=1, objects=[item])
    model = WorkspaceModel.from_proto(schema)
    obj = model.object("item")
    assert obj is not None
    return model, obj


HEADER = ["code", "Email", "qty", "active", "madeOn", "seenAt", "stage", "tags", "extra", "ref",
          "title"]  # fmt: skip
GOOD = ["c-1", "a@b.test", "2.5", "yes", "2026-01-31", "2026-01-31T10:00:00+02:00", "WON", "A, B",
        '{"k": [1]}', "AAAAAAAA-0000-4000-8000-000000000001", "T"]  # fmt: skip
# Per column, cells that are valid, empty or refused (by the cell parser or the field's check).
VARIANTS = {
    "code": ["", "x\x00y", "é"],
    "Email": ["", "not-an-email"],
    "qty": ["", "12", "1e400", "many", "nan", "9007199254740993"],
    "active": ["", "TRUE", "0", "maybe"],
    "madeOn": ["", "2026-02-30", "31/01/2026"],
    "seenAt": ["", "yesterday", "2026-01-31T10:00:00"],
    "stage": ["", "LOST"],
    "tags": ["", '["A","A"]', "A,C", "[1"],
    "extra": ["", "[", '"\\u0000"', "null"],
    "ref": ["", "nope"],
    "title": ["", " "],
}


def _outcome(action: Any) -> Any:
    try:
        prepared: inputs.Prepared = action()
    except ServiceError as exc:
        return type(exc).__name__, exc.message, exc.field
    columns = dict(prepared.columns)
    assert uuid.UUID(columns.pop("id")).version == 7
    return orjson.dumps(columns, option=orjson.OPT_SORT_KEYS), sorted(prepared.fields)


def _rows() -> list[list[str]]:
    rows = [GOOD, GOOD[:-1], [*GOOD, "extra cell"]]
    for index, column in enumerate(HEADER):
        rows += [[*GOOD[:index], cell, *GOOD[index + 1 :]] for cell in VARIANTS[column]]
    # Two refused cells: the first refused by its cell parser wins over an earlier field check.
    for (i, a), (j, b) in itertools.combinations(enumerate(HEADER), 2):
        for x, y in itertools.product(VARIANTS[a][1:], VARIANTS[b][1:]):
            row = list(GOOD)
            row[i], row[j] = x, y
            rows.append(row)
    return rows


@pytest.mark.parametrize("own_records_only", [False, True])
def test_the_csv_plan_prepares_every_row_as_the_generic_road_does(own_records_only: bool) -> None:
    model, obj = _model()
    access = Access(own_records_only, OWNER)
    targets = import_columns.header_targets(model, obj, HEADER, None)
    plan = CsvPlan.compile(obj, targets)
    assert plan is not None
    create = inputs.CreatePlan(obj, access)
    ids = inputs.RecordIds()
    rows = _rows()
    assert len(rows) > 250
    refused = accepted = 0
    for cells in rows:

        def generic_road(cells: list[str] = cells) -> inputs.Prepared:
            data = import_columns.csv_row(2, targets, cells).data
            return inputs.prepare_create(obj, data, "", access, ids)

        generic = _outcome(generic_road)
        fast = _outcome(lambda cells=cells: plan.prepare(create, cells, ids))
        assert fast == generic, cells
        refused += isinstance(generic[0], str)
        accepted += isinstance(generic[0], bytes)
    assert refused > 200
    assert accepted > 20


def test_columns_the_plan_does_not_cover_take_the_generic_road() -> None:
    model, obj = _model()
    for header in (["id", "code"], ["ownerId", "code"], ["code", "title"]):
        targets = import_columns.header_targets(model, obj, header, None)
        assert (CsvPlan.compile(obj, targets) is None) == (header[0] != "code")
    skipped = import_columns.header_targets(model, obj, ["code", "x"], {"code": "code", "x": None})
    assert CsvPlan.compile(obj, skipped) is not None


def test_a_prepared_batch_keeps_rejections_with_their_lines() -> None:
    model, obj = _model()
    targets = import_columns.header_targets(model, obj, ["code", "qty", "title"], None)
    create = inputs.CreatePlan(obj, Access(False, OWNER))
    preparer = RowPreparer(CSV, model, obj, targets, create)
    records = [
        (2, ["a", "1", "T"], ""),
        (3, None, "malformed CSV: x"),
        (5, ["b", "z", "T"], ""),
        (6, ["c", "2", ""], ""),
    ]
    batch = preparer.prepare(records)
    assert batch.read == 4
    assert [line for line, _ in batch.ready] == [2]
    assert batch.ready[0][1].columns["tier"] == "BASIC"
    assert batch.ready[0][1].columns["ownerId"] == OWNER
    assert batch.rejected == [
        (3, None, "malformed CSV: x"),
        (5, "qty", "qty: not a number"),
        (6, "title", "title: title is required"),
    ]

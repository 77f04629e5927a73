"""Import columns: a currency is set whole or by its parts, never both (a 400 for a CSV header,
a rejected row for an NDJSON line), rather than an internal error."""

from __future__ import annotations

import uuid

import pytest

from crm.metadata.v1 import metadata_pb2 as md
from crmkit.errors import InvalidArgument, ServiceError
from records import import_columns
from records.model import ObjectModel, WorkspaceModel

WS = "11111111-2222-4333-8444-555555555555"


def _model() -> tuple[WorkspaceModel, ObjectModel]:
    fields = [
        md.FieldMetadata(id=str(uuid.uuid4()), name=name, type=kind, is_active=True,
                         is_nullable=True, label=name)
        for name, kind in (("code", md.FIELD_TYPE_TEXT), ("amount", md.FIELD_TYPE_CURRENCY))
    ]  # fmt: skip
    item = md.ObjectMetadata(
        id=str(uuid.uuid4()), name_singular="item", name_plural="items", is_active=True,
        fields=fields,
    )  # fmt: skip
    model = WorkspaceModel.from_proto(
        md.WorkspaceSchema(workspace_id=WS, version=1, objects=[item])
    )
    obj = model.object("item")
    assert obj is not None
    return model, obj


@pytest.mark.parametrize(
    "header",
    [
        ["amount", "amount.amountMicros"],
        ["amount.currencyCode", "code", "amount"],
        ["amount.amountMicros", "amount.amountMicros"],
        ["code", "code"],
    ],
)
def test_a_header_setting_a_field_twice_is_refused_naming_both_columns(header: list[str]) -> None:
    model, obj = _model()
    with pytest.raises(InvalidArgument) as refused:
        import_columns.header_targets(model, obj, header, None)
    assert refused.value.field == header[-1]
    first = next(column for column in header if column.split(".")[0] == header[-1].split(".")[0])
    assert refused.value.message == (
        f"columns {first!r} and {header[-1]!r} both set {header[-1].split('.')[0]}"
    )


def test_a_header_with_a_currency_by_its_parts_is_accepted() -> None:
    model, obj = _model()
    targets = import_columns.header_targets(
        model, obj, ["amount.amountMicros", "amount.currencyCode", "code"], None
    )
    assert [target.path for target in targets if target] == [
        "amount.amountMicros", "amount.currencyCode", "code",
    ]  # fmt: skip


@pytest.mark.parametrize(
    "line",
    [
        b'{"amount": null, "amount.amountMicros": 5}',
        b'{"amount.amountMicros": 5, "amount": null}',
        b'{"amount": {"amountMicros": 5, "currencyCode": "EUR"}, "amount.currencyCode": "USD"}',
    ],
)
def test_an_ndjson_line_setting_a_currency_whole_and_by_part_is_rejected(line: bytes) -> None:
    model, obj = _model()
    with pytest.raises(ServiceError) as rejected:
        import_columns.ndjson_row(model, obj, 2, line)
    assert "amount is given whole and by part" in rejected.value.message


def test_an_ndjson_line_with_a_currency_by_its_parts_is_read() -> None:
    model, obj = _model()
    row = import_columns.ndjson_row(
        model, obj, 2, b'{"amount.amountMicros": 5, "amount.currencyCode": "EUR", "code": "x"}'
    )
    assert row.data == {"amount": {"amountMicros": 5, "currencyCode": "EUR"}, "code": "x"}

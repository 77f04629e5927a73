from __future__ import annotations

from gateway.owners import named_owners

ME = "11111111-1111-4111-8111-111111111111"
OTHER = "22222222-2222-4222-8222-222222222222"


def test_owners_other_than_the_caller_are_named_once_by_their_first_field() -> None:
    records = [{"ownerId": ME}, {}, {"ownerId": OTHER.upper()}, {"ownerId": OTHER}, 3]
    assert named_owners(records, batch=True, caller=ME) == {OTHER: "[2].ownerId"}
    assert named_owners([{"ownerId": OTHER}], batch=False, caller=ME) == {OTHER: "ownerId"}


def test_values_that_are_not_uuids_are_left_to_the_records_service() -> None:
    records = [{"ownerId": None}, {"ownerId": "nope"}, {"ownerId": 5}, {"name": "x"}]
    assert named_owners(records, batch=True, caller=ME) == {}

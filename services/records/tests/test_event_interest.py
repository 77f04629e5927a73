"""Who may hold interest in record events, and the relay's reading statement with and without
the interest gate."""

from __future__ import annotations

import uuid

import pytest

from crmkit.errors import InvalidArgument
from crmkit.event_interest import check_holder, gateway_holder
from records.event_interest import PUBLISH_CONDITION, lease_of, page_size, workspace_ids
from records.relay import fetch_sql


def field_of(error: pytest.ExceptionInfo[InvalidArgument]) -> str | None:
    return error.value.field


def test_holders_are_the_two_services_or_a_gateway_instance() -> None:
    assert check_holder("webhooks") == "webhooks"
    assert check_holder("workflows") == "workflows"
    assert check_holder(gateway_holder("a1b2-c3.d_4")) == "gateway:a1b2-c3.d_4"
    for bad in ("", "gateway", "gateway:", "gateway:a b", "records", "gateway:" + "x" * 101):
        with pytest.raises(InvalidArgument) as error:
            check_holder(bad)
        assert field_of(error) == "holder"


def test_only_a_gateway_holds_a_lease() -> None:
    assert lease_of("gateway:g", 60) == 60
    assert lease_of("webhooks", 0) == 0
    for holder, seconds in (("gateway:g", 0), ("gateway:g", 3601), ("workflows", 5)):
        with pytest.raises(InvalidArgument) as error:
            lease_of(holder, seconds)
        assert field_of(error) == "leaseSeconds"


def test_workspace_ids_are_canonical_distinct_and_bounded() -> None:
    one = uuid.uuid4()
    assert workspace_ids([str(one).upper(), str(one)]) == [str(one)]
    with pytest.raises(InvalidArgument) as error:
        workspace_ids(["nope"])
    assert field_of(error) == "workspaceIds"
    with pytest.raises(InvalidArgument):
        workspace_ids([str(uuid.uuid4()) for _ in range(1001)])
    assert page_size(0) == 100
    with pytest.raises(InvalidArgument):
        page_size(1001)


def test_the_gated_read_decides_and_marks_in_one_statement() -> None:
    gated = fetch_sql(gated=True, ahead=False)
    assert PUBLISH_CONDITION in gated
    assert "UPDATE records.outbox" in gated
    assert "NOT b.wanted" in gated
    ahead = fetch_sql(gated=True, ahead=True)
    # Rows read and not yet marked are left out through a hashed set (not a scan of the array
    # per row).
    assert "o.sequence NOT IN (SELECT unnest($2::bigint[]))" in ahead
    ungated = fetch_sql(gated=False, ahead=False)
    assert "event_interest" not in ungated
    assert "UPDATE" not in ungated
    assert ungated.startswith("SELECT ")
    assert ", true FROM" in ungated

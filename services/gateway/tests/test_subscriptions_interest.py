"""The gateway's leases on record events: declared once however many subscriptions open at
once, fresh for half their time, renewed for the workspaces still subscribed, refused as
UNAVAILABLE when records cannot answer."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from crm.records.v1 import records_pb2
from crmkit.errors import Unavailable
from crmkit.principal import PrincipalCodec
from gateway.subscriptions.interest import InterestLeases

WS = "5f0e6a52-0c3e-4c1e-9a43-8f6b1b7c2d10"
OTHER = "0b7b6a1e-8a53-4a8f-9d7e-1b2f3c4d5e6f"


def refused() -> grpc.aio.AioRpcError:
    error: grpc.aio.AioRpcError = grpc.aio.AioRpcError(
        grpc.StatusCode.UNAVAILABLE,
        grpc.aio.Metadata(),
        grpc.aio.Metadata(),
        details="records is down",
    )
    return error


class Records:
    def __init__(self) -> None:
        self.calls: list[records_pb2.DeclareEventInterestRequest] = []
        self.down = False

    async def DeclareEventInterest(  # noqa: N802
        self, request: records_pb2.DeclareEventInterestRequest, **_: Any
    ) -> records_pb2.DeclareEventInterestResponse:
        await asyncio.sleep(0.01)
        if self.down:
            raise refused()
        self.calls.append(request)
        return records_pb2.DeclareEventInterestResponse()


def leases(records: Records, open_workspaces: set[str]) -> InterestLeases:
    stub: Any = records
    return InterestLeases(
        stub, PrincipalCodec("x" * 32), lambda: open_workspaces, instance="g1", lease=60
    )


async def test_many_subscriptions_opening_at_once_declare_one_lease() -> None:
    records = Records()
    keeper = leases(records, {WS})
    await asyncio.gather(*(keeper.ensure(WS) for _ in range(50)))
    await keeper.ensure(WS)  # fresh: no call
    assert [(c.holder, list(c.workspace_ids), c.lease_seconds) for c in records.calls] == [
        ("gateway:g1", [WS], 60)
    ]
    assert keeper.fresh(WS)
    assert not keeper.fresh(OTHER)


async def test_renewal_covers_the_open_workspaces_and_forgets_the_others() -> None:
    records = Records()
    open_now = {WS}
    keeper = leases(records, open_now)
    await keeper.ensure(OTHER)
    await keeper.renew()
    assert list(records.calls[-1].workspace_ids) == [WS]
    assert keeper.fresh(WS)
    assert not keeper.fresh(OTHER)


async def test_a_lease_records_cannot_grant_refuses_the_subscription() -> None:
    records = Records()
    records.down = True
    keeper = leases(records, {WS})
    with pytest.raises(Unavailable, match="cannot be subscribed to now"):
        await keeper.ensure(WS)
    assert not keeper.fresh(WS)
    await keeper.renew()  # a failed renewal is logged, not raised

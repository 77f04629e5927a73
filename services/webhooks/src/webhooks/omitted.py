"""Reading the record of an event the relay published without it (`record_omitted`: the
envelope was over the NATS message limit, see docs/events.md).

The record is read by id from the records service as the workspace's system principal, as the
gateway's subscription feed does (soft-deleted records included). It is the current state when
the attempt is made, which may already include a later change; the state before the change
(`previous_record_omitted`) cannot be read back and is sent as null with the truncation header.
"""

from __future__ import annotations

import grpc

from crm.records.v1 import records_pb2, records_pb2_grpc
from crmkit.principal import PrincipalCodec, system_principal


class RecordUnavailable(Exception):
    """The records service could not answer now: the attempt fails and is retried."""


class RecordReader:
    def __init__(self, records: records_pb2_grpc.RecordsServiceStub, principals: PrincipalCodec):
        self._records = records
        self._principals = principals

    async def current(self, workspace_id: str, object_name: str, record_id: str) -> str | None:
        """The record's JSON as the API returns it (depth 0), or None if it no longer exists."""
        try:
            reply = await self._records.GetRecord(
                records_pb2.GetRecordRequest(
                    ref=records_pb2.ObjectRef(object=object_name),
                    id=record_id,
                    deleted=records_pb2.DELETED_SCOPE_INCLUDE,
                ),
                metadata=self._principals.metadata(system_principal(workspace_id)),
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise RecordUnavailable(
                f"the record left out of the event (over the size limit) cannot be read now: "
                f"{exc.details()}"
            ) from None
        return bytes(reply.record_json).decode()

"""Reading the record of an event the relay published without it.

An envelope larger than the NATS message limit leaves the record out (`record_omitted`); the
feed then reads it by id from the records service, as the workspace's system principal (the
subscriber's own permissions are applied by the hub and the schema as for any event). The record
read is the current state, which may already include a later change.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import orjson

from crm.records.v1 import records_pb2
from crmkit.errors import ServiceError
from crmkit.principal import PrincipalCodec, system_principal
from gateway.rpc import call
from gateway.subscriptions.events import RecordChange
from gateway.subscriptions.feed import RecordLoader
from gateway.upstreams import Upstreams

log = logging.getLogger("gateway.subscriptions")


def omitted_record_loader(upstreams: Upstreams, principals: PrincipalCodec) -> RecordLoader:
    async def load(change: RecordChange) -> Mapping[str, Any] | None:
        request = records_pb2.GetRecordRequest(
            ref=records_pb2.ObjectRef(object=change.object),
            id=change.record_id,
            deleted=records_pb2.DELETED_SCOPE_INCLUDE,
        )
        metadata = principals.metadata(system_principal(change.workspace_id))
        try:
            response = await call(upstreams.records.GetRecord, request, metadata)
        except ServiceError as exc:
            log.warning("omitted record not readable", extra={"error": exc.message})
            return None
        record = orjson.loads(response.record_json)
        return record if isinstance(record, dict) else None

    return load

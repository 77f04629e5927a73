"""Import jobs as stored in `records.import_jobs` (docs/api.md, "Import"): their JSON view,
listing, cancelling and their rejections."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson

from crmkit.errors import FailedPrecondition, InvalidArgument, NotFound
from records.reads import parse_id

QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED = (
    "queued",
    "running",
    "succeeded",
    "failed",
    "cancelled",
)
ACTIVE = (QUEUED, RUNNING)
FIRST_REJECTIONS = 10
DEFAULT_PAGE, MAX_PAGE = 20, 100
REJECTIONS_CHUNK = 1000

_TIME = "to_char({} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')"
_VIEW = (
    "SELECT j.id::text, j.object, j.format, j.state, j.options, j.size_bytes, j.rows_read, "
    "j.rows_written, j.rows_rejected, j.error, "
    f"{_TIME.format('j.created_at')} AS created_at, {_TIME.format('j.started_at')} AS started_at, "
    f"{_TIME.format('j.finished_at')} AS finished_at, "
    "(SELECT coalesce(json_agg(json_build_object('line', r.line, 'field', r.field, "
    "'reason', r.reason) ORDER BY r.line), '[]') FROM (SELECT * FROM records.import_rejections "
    f"WHERE job_id = j.id ORDER BY line LIMIT {FIRST_REJECTIONS}) r) AS first_rejections "
    "FROM records.import_jobs j"
)


def view(row: Any) -> dict[str, Any]:
    options = row["options"]
    return {
        "id": row["id"],
        "object": row["object"],
        "format": row["format"],
        "state": row["state"],
        "upsert": options.get("upsert") or None,
        "emitEvents": options.get("events", True),
        "sizeBytes": row["size_bytes"],
        "rowsRead": row["rows_read"],
        "rowsWritten": row["rows_written"],
        "rowsRejected": row["rows_rejected"],
        "firstRejections": row["first_rejections"],
        "error": row["error"],
        "createdAt": row["created_at"],
        "startedAt": row["started_at"],
        "finishedAt": row["finished_at"],
    }


def _id(value: str) -> str:
    return parse_id(value, "id")


async def get(connection: Any, workspace_id: str, job_id: str) -> dict[str, Any]:
    row = await connection.fetchrow(
        f"{_VIEW} WHERE j.id = $1 AND j.workspace_id = $2", _id(job_id), workspace_id
    )
    if row is None:
        raise NotFound(f"import job {job_id} not found", field="id")
    return view(row)


async def page(
    connection: Any, workspace_id: str, first: int, after: str
) -> tuple[list[dict[str, Any]], bool]:
    """Jobs of the workspace, newest first (ids are time-ordered), after job id `after`."""
    size = first or DEFAULT_PAGE
    if not 1 <= size <= MAX_PAGE:
        raise InvalidArgument(f"first must be between 1 and {MAX_PAGE}", field="first")
    if after:
        rows = await connection.fetch(
            f"{_VIEW} WHERE j.workspace_id = $1 AND j.id < $2 ORDER BY j.id DESC LIMIT $3",
            workspace_id,
            _id(after),
            size + 1,
        )
    else:
        rows = await connection.fetch(
            f"{_VIEW} WHERE j.workspace_id = $1 ORDER BY j.id DESC LIMIT $2",
            workspace_id,
            size + 1,
        )
    return [view(row) for row in rows[:size]], len(rows) > size


async def cancel(connection: Any, workspace_id: str, job_id: str) -> dict[str, Any]:
    """Cancels a queued or running job (waits for its current batch); rows written stay."""
    async with connection.transaction():
        state = await connection.fetchval(
            "SELECT state FROM records.import_jobs WHERE id = $1 AND workspace_id = $2 FOR UPDATE",
            _id(job_id),
            workspace_id,
        )
        if state is None:
            raise NotFound(f"import job {job_id} not found", field="id")
        if state not in ACTIVE and state != CANCELLED:
            raise FailedPrecondition(f"the import job has already {state}", field="id")
        if state in ACTIVE:
            await connection.execute(
                "UPDATE records.import_jobs SET state = $2, finished_at = now() WHERE id = $1",
                _id(job_id),
                CANCELLED,
            )
            await drop_upload(connection, _id(job_id))
    return await get(connection, workspace_id, job_id)


async def drop_upload(connection: Any, job_id: str) -> None:
    """A finished job's stored file and match keys are not needed any more."""
    await connection.execute("DELETE FROM records.import_chunks WHERE job_id = $1", job_id)
    await connection.execute("DELETE FROM records.import_keys WHERE job_id = $1", job_id)


async def rejections(connection: Any, workspace_id: str, job_id: str) -> AsyncIterator[bytes]:
    """Every rejection of the job in line order, as JSON arrays of up to 1000."""
    await get(connection, workspace_id, job_id)
    line = 0
    while True:
        rows = await connection.fetch(
            "SELECT line, field, reason FROM records.import_rejections "
            "WHERE job_id = $1 AND line > $2 ORDER BY line LIMIT $3",
            _id(job_id),
            line,
            REJECTIONS_CHUNK,
        )
        if not rows:
            return
        yield orjson.dumps(
            [{"line": r["line"], "field": r["field"], "reason": r["reason"]} for r in rows]
        )
        line = rows[-1]["line"]

"""Runs queued import jobs: each batch of rows is written (through the normal create or upsert
statements, so validation, access and events are those of the API) in one transaction with its
rejections and the job's counters, so a job resumes exactly where its last batch committed.
The next batch is read and checked (`import_rows`, in the reader's thread) while one is written.

Two batches are written at once, on two connections, so that the database works on one while it
commits the other; each commits only after the batch before it did (its counter update names the
`rows_read` it follows), so the committed batches are always a prefix of the file. A batch holding
a unique value the batch before it waits for (a value repeated across the two) gives way: it is
rolled back and written again once that one committed, so the earlier line keeps the value, as
when batches are written one at a time; a batch naming records of the imported object (a
self-relation) starts after the one before it committed, so it finds the records that one
created. A batch read or written and not committed is read again when the job resumes.

A job is taken under a session advisory lock held by the worker's own connection: a process that
dies releases it with its connection, and another worker (or the restarted one) resumes the job.
A row the database refuses (a duplicate unique value, a missing relation) is rejected and the
batch retried without it, inside a savepoint: a batch is never half applied. Once a create
import has met a value a record holds, its batches look their unique values up first, so a file
imported again costs a query per batch rather than a failed statement per row.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import orjson

from crm.common.v1 import common_pb2
from crmkit import authz
from crmkit.db import DATABASE_UNAVAILABLE
from crmkit.errors import AlreadyExists, ServiceError, Unavailable
from crmkit.outages import OutageLog
from records import import_columns, import_jobs, inputs, upserts, writes
from records.cache import SchemaCache
from records.context import RequestContext
from records.import_columns import Row, Target
from records.import_rows import INDEXED, PreparedBatch, Rejection, RowPreparer, rejection
from records.import_source import Reader
from records.inputs import Prepared, RecordIds
from records.model import FieldModel, ObjectModel
from records.predicates import owner_predicate
from records.sql import Params, quote

log = logging.getLogger(__name__)


@dataclass
class _Job:
    id: str
    fmt: str
    ctx: RequestContext
    obj: ObjectModel
    access: authz.Access
    match: FieldModel | None
    events: bool
    rows: RowPreparer
    # A create import that met a unique value a record already holds (a file imported again):
    # its batches look such rows up before writing, rather than failing on them one by one.
    held_values: bool = False


@dataclass
class _Batch:
    rejected: list[Rejection] = field(default_factory=list)
    written: int = 0

    def reject(self, line: int, error: ServiceError) -> None:
        self.rejected.append(rejection(line, error))


def _lock_key(job_id: str) -> int:
    return int.from_bytes(uuid.UUID(job_id).bytes[:8], "big", signed=True)


class ImportWorker:
    def __init__(
        self,
        database_url: str,
        pool: Any,
        cache: SchemaCache,
        *,
        batch_size: int,
        poll_seconds: float,
        server_settings: dict[str, str] | None = None,
    ) -> None:
        self._database_url = database_url
        self._server_settings = server_settings or {}
        self._pool = pool
        self._cache = cache
        self._batch_size = batch_size
        self._poll = poll_seconds
        self._ids = RecordIds()
        self._outage = OutageLog("database (import worker)", log)

    async def _connect(self) -> Any:
        return await asyncpg.connect(self._database_url, server_settings=self._server_settings)

    async def run(self) -> None:
        while True:
            try:
                connection = await self._connect()
                try:
                    await _json_codecs(connection)
                    self._outage.recovered()
                    await self._serve(connection)
                finally:
                    await connection.close()
            except DATABASE_UNAVAILABLE as exc:
                self._outage.failed(exc)
                await asyncio.sleep(self._poll)

    async def _serve(self, connection: Any) -> None:
        while True:
            job_id = await self._claim(connection)
            if job_id is None:
                await asyncio.sleep(self._poll)
                continue
            try:
                await self._run_job(connection, job_id)
            except Unavailable as exc:
                log.warning("import job %s paused: %s", job_id, exc)
                await asyncio.sleep(self._poll)
            except DATABASE_UNAVAILABLE:
                raise
            except Exception:
                log.exception("import job %s failed", job_id)
                await _finish(connection, job_id, import_jobs.FAILED, "internal error")
            finally:
                await connection.execute("SELECT pg_advisory_unlock($1)", _lock_key(job_id))

    async def _claim(self, connection: Any) -> str | None:
        rows = await connection.fetch(
            "SELECT id::text FROM records.import_jobs WHERE state IN ('queued', 'running') "
            "ORDER BY created_at LIMIT 50"
        )
        for (job_id,) in rows:
            if await connection.fetchval("SELECT pg_try_advisory_lock($1)", _lock_key(job_id)):
                return str(job_id)
        return None

    async def _run_job(self, connection: Any, job_id: str) -> None:
        row = await connection.fetchrow(
            "SELECT workspace_id::text, object, format, state, options, principal, rows_read "
            "FROM records.import_jobs WHERE id = $1",
            job_id,
        )
        if row is None or row["state"] not in import_jobs.ACTIVE:
            return
        try:
            job = await self._job(job_id, row)
        except ServiceError as exc:
            await _finish(connection, job_id, import_jobs.FAILED, exc.message)
            return
        await connection.execute(
            "UPDATE records.import_jobs SET state = 'running', "
            "started_at = coalesce(started_at, now()) WHERE id = $1 AND state = 'queued'",
            job_id,
        )
        reader = Reader(job.fmt, self._chunk_fetcher(job_id))
        await reader.skip(row["rows_read"])
        second = await self._connect()
        try:
            await _json_codecs(second)
            await self._write_batches(job, reader, (connection, second), row["rows_read"])
        finally:
            await second.close()

    async def _write_batches(
        self, job: _Job, reader: Reader, connections: tuple[Any, Any], rows_read: int
    ) -> None:
        """Writes the file's batches from `rows_read` on, two in flight (see the module's
        docstring), and finishes the job after the last."""

        def take() -> asyncio.Future[PreparedBatch]:
            return asyncio.ensure_future(reader.take(self._batch_size, job.rows.prepare))

        # The next batch is read and prepared (in the reader's thread) while these are written:
        # parsing and checks overlap the database's work.
        upcoming = take()
        in_flight: asyncio.Future[bool] | None = None
        started: list[asyncio.Future[Any]] = [upcoming]
        turn = 0
        try:
            while True:
                prepared = await upcoming
                if not prepared.read:
                    if in_flight is None or await in_flight:
                        await _finish_if_active(connections[0], job.id)
                    return
                upcoming = take()
                behind = None if in_flight is None else (in_flight, connections[1 - turn])
                current = asyncio.ensure_future(
                    self._commit(connections[turn], job, prepared, rows_read, behind)
                )
                started = [upcoming, current]
                turn = 1 - turn
                rows_read += prepared.read
                if in_flight is not None and not await in_flight:
                    return  # cancelled: `current` rolls back on its own
                in_flight = current
        finally:
            # A batch read ahead is read again when the job resumes; its failure, if any, is
            # the next run's to meet. A batch being written rolls back or commits on its own.
            for task in started:
                if task is upcoming and not task.done():
                    task.cancel()
                else:
                    await asyncio.wait([task])
                if task.done() and not task.cancelled():
                    task.exception()

    async def _commit(
        self,
        connection: Any,
        job: _Job,
        prepared: PreparedBatch,
        rows_read: int,
        behind: tuple[asyncio.Future[bool], Any] | None,
    ) -> bool:
        """Writes one batch in a transaction that commits after the batch it follows (`behind`:
        that batch's outcome and connection) did, while the job is active. True if it
        committed."""
        original = prepared
        if behind is not None and _names_own_records(job, prepared):
            # It may name records the batch before it creates: those must be committed first.
            if not await behind[0]:
                return False
            behind = None
        while True:
            attempt = _copy(original)  # writing takes rejected rows out of the lists
            try:
                async with connection.transaction():
                    batch = await self._apply(connection, job, attempt)
                    if behind is not None and not await _after(connection, *behind):
                        raise _Stopped
                    if not await _record(connection, job.id, rows_read, attempt.read, batch):
                        raise _Stopped  # cancelled
                return True
            except _Stopped:
                return False
            except (_GiveWay, asyncpg.DeadlockDetectedError):
                # Rolled back: written again once the batch before it committed.
                if behind is not None and not await behind[0]:
                    return False
                behind = None

    async def _job(self, job_id: str, row: Any) -> _Job:
        principal = common_pb2.Principal.FromString(row["principal"])
        model = await self._cache.get(str(row["workspace_id"]))
        ctx = RequestContext(principal, model)
        obj = ctx.object(row["object"])
        access = ctx.require(obj, authz.WRITE)
        options = row["options"]
        match = upserts.match_field(obj, options["upsert"]) if options.get("upsert") else None
        targets: list[Target | None] = []
        for index, path in enumerate(options.get("columns") or []):
            targets.append(
                None if path is None else import_columns.resolve(model, obj, path, str(index))
            )
        rows = RowPreparer(row["format"], model, obj, targets, inputs.CreatePlan(obj, access))
        return _Job(
            job_id,
            row["format"],
            ctx,
            obj,
            access,
            match,
            options.get("events", True),
            rows,
        )

    def _chunk_fetcher(self, job_id: str) -> Any:
        async def fetch(seq: int) -> bytes | None:
            async with self._pool.acquire() as connection:
                data: bytes | None = await connection.fetchval(
                    "SELECT data FROM records.import_chunks WHERE job_id = $1 AND seq = $2",
                    job_id,
                    seq,
                )
            return data

        return fetch

    # -- one batch ------------------------------------------------------------------------------

    async def _apply(self, connection: Any, job: _Job, prepared: PreparedBatch) -> _Batch:
        batch = _Batch(list(prepared.rejected))
        ready = prepared.ready
        if prepared.pending:
            rows = await _find_relations(connection, job, prepared.pending, batch)
            for row in rows:
                try:
                    ready.append((row.line, job.rows.create.prepare(row.data, "", self._ids)))
                except ServiceError as exc:
                    batch.reject(row.line, exc)
            ready.sort(key=lambda entry: entry[0])  # file order: the earliest line keeps a value
        if job.match is not None:
            ready = await _first_occurrences(connection, job, job.match, ready, batch)
        await _write(connection, job, ready, batch)
        return batch


async def _json_codecs(connection: Any) -> None:
    for type_name in ("json", "jsonb"):
        await connection.set_type_codec(
            type_name,
            encoder=lambda value: orjson.dumps(value).decode(),
            decoder=orjson.loads,
            schema="pg_catalog",
        )


async def _finish(connection: Any, job_id: str, state: str, error: str | None) -> None:
    await connection.execute(
        "UPDATE records.import_jobs SET state = $2, error = $3, finished_at = now() "
        "WHERE id = $1 AND state IN ('queued', 'running')",
        job_id,
        state,
        error,
    )
    await import_jobs.drop_upload(connection, job_id)


class _Stopped(Exception):
    """The batch must not commit: the job was cancelled, or the batch before it did not commit."""


class _GiveWay(Exception):
    """The batch before this one waits for a row this one wrote."""


def _names_own_records(job: _Job, prepared: PreparedBatch) -> bool:
    """Whether the batch sets a relation of the imported object to a record of that object (by
    id or by a unique value)."""
    own = [
        item
        for item in job.obj.stored_fields
        if item.is_many_to_one and item.target_object_id == job.obj.id
    ]
    if any(job.obj.field(name) in own for row in prepared.pending for name in row.lookups):
        return True
    columns = [item.column for item in own]
    return any(row.columns.get(name) is not None for _, row in prepared.ready for name in columns)


def _copy(prepared: PreparedBatch) -> PreparedBatch:
    return PreparedBatch(
        prepared.read, list(prepared.ready), list(prepared.pending), list(prepared.rejected)
    )


async def _after(connection: Any, before: asyncio.Future[bool], before_connection: Any) -> bool:
    """Waits for the batch written on `before_connection` to end (True if it committed), and
    raises `_GiveWay` when that batch waits for a lock this connection's transaction holds."""
    while True:
        done, _ = await asyncio.wait([before], timeout=0.2)
        if done:
            return before.result()
        if await connection.fetchval(
            "SELECT $1::int = ANY(pg_blocking_pids($2::int))",
            connection.get_server_pid(),
            before_connection.get_server_pid(),
        ):
            raise _GiveWay


async def _finish_if_active(connection: Any, job_id: str) -> None:
    async with connection.transaction():
        state = await connection.fetchval(
            "SELECT state FROM records.import_jobs WHERE id = $1 FOR UPDATE", job_id
        )
        if state in import_jobs.ACTIVE:
            await _finish(connection, job_id, import_jobs.SUCCEEDED, None)


async def _record(connection: Any, job_id: str, rows_read: int, read: int, batch: _Batch) -> bool:
    """Counts the batch of `read` rows that follows `rows_read` rows, if the job is active and
    has committed them; False (and nothing written) otherwise."""
    counted = await connection.fetchval(
        "UPDATE records.import_jobs SET rows_read = rows_read + $2, "
        "rows_written = rows_written + $3, rows_rejected = rows_rejected + $4 "
        "WHERE id = $1 AND rows_read = $5 AND state IN ('queued', 'running') RETURNING true",
        job_id,
        read,
        batch.written,
        len(batch.rejected),
        rows_read,
    )
    if not counted:
        return False
    if batch.rejected:
        await connection.executemany(
            "INSERT INTO records.import_rejections (job_id, line, field, reason) "
            "VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
            [(job_id, line, name, reason) for line, name, reason in batch.rejected],
        )
    return True


async def _find_relations(connection: Any, job: _Job, rows: list[Row], batch: _Batch) -> list[Row]:
    """Sets each `<relation>.<unique field>` to the id of the record holding the value."""
    kept = rows
    for name in sorted({name for row in rows for name in row.lookups}):
        relation = job.obj.field(name)
        target = job.ctx.model.by_id(relation.target_object_id) if relation else None
        if relation is None or target is None:
            continue
        wanted = [(i, row.lookups[name]) for i, row in enumerate(kept) if name in row.lookups]
        lookup = wanted[0][1][0]
        access = job.ctx.read_access(target)
        found: dict[int, str] = {}
        if access is not None:
            params = Params()
            payload = params.add([{"v": value, "i": i} for i, (_, value) in wanted], "json")
            owner = owner_predicate("t", access, params) or "TRUE"
            column = quote(lookup.column)
            try:
                async with connection.transaction():
                    result = await connection.fetch(
                        f"SELECT x.i, t.id::text FROM json_to_recordset({payload}) AS "
                        f"x(v {lookup.columns[0].sql_type}, i int) JOIN {target.table} t "
                        f'ON t.{column} = x.v WHERE t."deletedAt" IS NULL AND {owner}',
                        *params.values,
                    )
                found = {row[0]: row[1] for row in result}
            except asyncpg.DataError:
                found = {}
        missing: set[int] = set()
        for i, (_, value) in wanted:
            if i in found:
                kept[i].data[relation.key] = found[i]
            else:
                missing.add(i)
                batch.rejected.append(
                    (
                        kept[i].line,
                        f"{name}.{lookup.name}",
                        f"no {target.name_singular} with {lookup.name} {value!r}",
                    )
                )
        kept = [row for i, row in enumerate(kept) if i not in missing]
    return kept


async def _first_occurrences(
    connection: Any,
    job: _Job,
    match: FieldModel,
    pending: list[tuple[int, Prepared]],
    batch: _Batch,
) -> list[tuple[int, Prepared]]:
    """Upserts: a match value seen on an earlier line of the file rejects the later row."""
    keyed: list[tuple[bytes, int]] = []
    kept: list[tuple[int, Prepared]] = []
    for line, prepared in pending:
        value = prepared.columns.get(match.column)
        if value is None:
            batch.rejected.append((line, match.name, f"required to upsert on {match.name}"))
            continue
        keyed.append((hashlib.sha256(orjson.dumps(value)).digest(), line))
        kept.append((line, prepared))
    if not keyed:
        return []
    fresh = {
        row[0]
        for row in await connection.fetch(
            "INSERT INTO records.import_keys (job_id, key_hash, line) "
            "SELECT $1, k, l FROM unnest($2::bytea[], $3::bigint[]) AS x(k, l) "
            "ON CONFLICT DO NOTHING RETURNING line",
            job.id,
            [k for k, _ in keyed],
            [line for _, line in keyed],
        )
    }
    result = []
    for line, prepared in kept:
        if line in fresh:
            result.append((line, prepared))
        else:
            batch.rejected.append(
                (line, match.name, f"the same {match.name} as an earlier line of the file")
            )
    return result


async def _write(
    connection: Any, job: _Job, pending: list[tuple[int, Prepared]], batch: _Batch
) -> None:
    """Writes `pending` in one statement; a row the statement refuses is rejected and the rest
    written again (in a savepoint each time)."""
    checked = False
    while pending:
        if job.held_values and not checked:
            pending = await _drop_held(connection, job, pending, batch)
            checked = True
            continue
        try:
            async with connection.transaction():
                rows = [prepared for _, prepared in pending]
                if job.match is not None:
                    await upserts.upsert(
                        connection, job.ctx, job.obj, job.access, rows, job.match, (),
                        events=job.events, bulk=True,
                    )  # fmt: skip
                else:
                    await writes.insert(connection, job.ctx, job.obj, rows, events=job.events)
            batch.written += len(pending)
            return
        except Unavailable:
            raise
        except ServiceError as exc:
            found = INDEXED.match(exc.field or "")
            index = int(found.group(1)) if found else (0 if len(pending) == 1 else None)
            if index is None or index >= len(pending):
                # Not attributable to one row: write them one by one.
                for single in pending:
                    await _write(connection, job, [single], batch)
                return
            if isinstance(exc, AlreadyExists) and job.match is None and not checked:
                job.held_values = True  # from now on, and for the rest of this batch
                continue
            repeats = _repeats(job, pending, index, found.group(2) if found else "")
            if len(repeats) > 1:
                # A value repeated within the batch: the earliest line keeps it.
                first = pending[repeats[0]][0]
                for later in reversed(repeats[1:]):
                    line = pending[later][0]
                    batch.rejected.append(
                        (line, found.group(2) if found else None, f"the same value as line {first}")
                    )
                    del pending[later]
                continue
            batch.reject(pending[index][0], exc)
            del pending[index]


async def _drop_held(
    connection: Any, job: _Job, pending: list[tuple[int, Prepared]], batch: _Batch
) -> list[tuple[int, Prepared]]:
    """Rejects the rows whose unique value a live record holds (as the insert would); the
    others are kept."""
    held = await writes.held_unique_values(connection, job.obj, [row for _, row in pending])
    for index, item in held.items():
        path = f"[{index}].{item.name}"  # reported as the statement's own refusal would be
        batch.reject(pending[index][0], writes.already_exists(job.obj, item.name, path))
    return [entry for index, entry in enumerate(pending) if index not in held]


def _repeats(job: _Job, pending: list[tuple[int, Prepared]], index: int, name: str) -> list[int]:
    """Indexes of the rows holding row `index`'s value of unique field `name` (with it)."""
    item = job.obj.field(name) if name else None
    if item is None or not item.is_unique or len(item.columns) != 1:
        return [index]
    value = pending[index][1].columns.get(item.column)
    return [i for i, (_, row) in enumerate(pending) if row.columns.get(item.column) == value]

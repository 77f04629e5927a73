"""Creates of one record each, by one caller in one object, that arrive while that caller's
earlier creates are in PostgreSQL, written together by one statement.

Each create alone is a statement, a commit and a WAL flush, and PostgreSQL's share of a 20-row
list is less than half of a create's. A statement of 4 rows cost PostgreSQL 0.20 ms and this
service 0.18 ms a record, against 0.62 and 0.64 ms for single-row statements (docs/benchmarks.md,
ninth reading). So the creates of one group (the same principal, data-model version, object and
returned fields: their statements are then the same but for the rows) run at most `in_flight`
statements at a time. A create that arrives when fewer are in flight runs at once, alone, in its
caller's own task, as every create did before: nothing waits where nothing is busy. One that
arrives when `in_flight` are running waits, and every create that waited goes in the next
statement (at most MAX_ROWS), as soon as one of them ends.

What each caller sees is what it would have seen alone:
- each record's events carry its own request's trace context (`outbox.Provenance.bound`);
- a group's statement that fails (a unique value taken, a relation not readable, a value the
  table refuses) rolled back whole, so each of its creates runs again alone and gets its own
  answer; an error of the connection (the statement may have committed) is every member's;
- the statement runs in a task of its own: a caller that gives up (cancelled, past its deadline)
  does not cancel the others' writes; one that gives up before its group's statement started is
  taken out of it, so its record is not written.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import asyncpg

from crmkit.errors import ServiceError
from crmkit.telemetry import trace_context_headers
from records import writes
from records.context import RequestContext
from records.inputs import Prepared
from records.model import ObjectModel

MAX_ROWS = 100  # records per grouped statement

# Errors of the statement itself (it rolled back whole): its creates can each run again alone.
_STATEMENT_ERRORS = (asyncpg.PostgresError, ServiceError)

GroupKey = tuple[bytes, str, int, str, tuple[str, ...]]


@dataclass(eq=False)
class _Create:
    ctx: RequestContext
    obj: ObjectModel
    row: Prepared
    names: tuple[str, ...]
    trace: dict[str, str]
    answer: asyncio.Future[writes.Written]

    @property
    def record_id(self) -> str:
        return str(self.row.columns["id"])


class _Group:
    __slots__ = ("running", "waiting")

    def __init__(self) -> None:
        self.running = 0  # statements in flight
        self.waiting: list[_Create] = []


class CreateGroups:
    """Single-record creates, grouped as the module docstring says. `in_flight` 0: every create
    alone (no grouping). `observe(rows)` is told the rows of every statement."""

    def __init__(self, pool: Any, in_flight: int, observe: Callable[[int], None]) -> None:
        self._pool = pool
        self._in_flight = in_flight
        self._observe = observe
        self._groups: dict[GroupKey, _Group] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def create(
        self, ctx: RequestContext, obj: ObjectModel, row: Prepared, names: tuple[str, ...]
    ) -> writes.Written:
        if self._in_flight <= 0:
            return await self._alone(ctx, obj, row, names)
        principal = ctx.principal.SerializeToString(deterministic=True)
        key = (principal, ctx.model.workspace_id, ctx.model.version, obj.id, names)
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = _Group()
        if group.running < self._in_flight and not group.waiting:
            group.running += 1
            try:
                return await self._alone(ctx, obj, row, names)
            finally:
                group.running -= 1
                self._next(key, group)
        answer: asyncio.Future[writes.Written] = asyncio.get_running_loop().create_future()
        create = _Create(ctx, obj, row, names, trace_context_headers(), answer)
        group.waiting.append(create)
        try:
            return await answer
        except asyncio.CancelledError:
            if create in group.waiting:
                group.waiting.remove(create)
                self._next(key, group)
            raise

    async def _alone(
        self, ctx: RequestContext, obj: ObjectModel, row: Prepared, names: tuple[str, ...]
    ) -> writes.Written:
        self._observe(1)
        async with self._pool.acquire() as connection:
            written = await writes.create(connection, ctx, obj, [row], names)
        return written[0]

    def _next(self, key: GroupKey, group: _Group) -> None:
        """Start the waiting creates' statements while fewer than `in_flight` run; forget an
        idle group."""
        while group.waiting and group.running < self._in_flight:
            batch, group.waiting = group.waiting[:MAX_ROWS], group.waiting[MAX_ROWS:]
            group.running += 1
            task = asyncio.get_running_loop().create_task(self._together(key, group, batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if not group.waiting and group.running == 0 and self._groups.get(key) is group:
            del self._groups[key]

    async def _together(self, key: GroupKey, group: _Group, batch: list[_Create]) -> None:
        try:
            try:
                written = await self._write(batch)
            except _STATEMENT_ERRORS as error:
                if len(batch) == 1:
                    _fail(batch[0], error)
                else:
                    await asyncio.gather(*(self._again_alone(create) for create in batch))
                return
            except asyncio.CancelledError:
                for create in batch:
                    create.answer.cancel()
                raise
            except Exception as error:  # the connection's failure: every member's
                for create in batch:
                    _fail(create, error)
                return
            for create, record in zip(batch, written, strict=True):
                if not create.answer.done():
                    create.answer.set_result(record)
        finally:
            group.running -= 1
            self._next(key, group)

    async def _write(self, batch: list[_Create]) -> list[writes.Written]:
        first = batch[0]
        self._observe(len(batch))
        traces = {create.record_id: create.trace for create in batch}
        async with self._pool.acquire() as connection:
            return await writes.create(
                connection,
                first.ctx,
                first.obj,
                [create.row for create in batch],
                first.names,
                traces=traces,
            )

    async def _again_alone(self, create: _Create) -> None:
        try:
            written = await self._write([create])
        except Exception as error:  # handed to the caller, raised there
            _fail(create, error)
        else:
            if not create.answer.done():
                create.answer.set_result(written[0])


def _fail(create: _Create, error: BaseException) -> None:
    if not create.answer.done():
        create.answer.set_exception(error)

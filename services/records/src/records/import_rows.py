"""An import job's parsed records turned into prepared rows, before any database work: this is
the part of a batch that runs in the reader's thread while the previous batch is written.

Every row goes through the API's checks (`import_columns.cell`, `values.write_value`,
`inputs.CreatePlan`). A CSV whose columns all set plain fields (no relation, currency, `id` or
`ownerId`) takes a shorter road to the same result: its columns are the same on every row, so
the field behind each column is looked up once per job and each row becomes its column values
directly, checked in the same order with the same messages. A row naming a related record by
a unique value waits for the batch's lookup (`import_worker`) before it is prepared.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from crmkit.errors import ServiceError
from records import import_columns, values
from records.import_columns import Row, Target
from records.import_source import CSV, Record
from records.inputs import CreatePlan, Prepared, RecordIds
from records.model import ObjectModel, WorkspaceModel

INDEXED = re.compile(r"^\[(\d+)\]\.?(.*)$")  # a batch path: [3].email

# (line, field or None, reason), as stored in records.import_rejections.
Rejection = tuple[int, str | None, str]


def rejection(line: int, error: ServiceError) -> Rejection:
    """The rejection of the row at `line` for `error` (a batch statement's `[i].field` path is
    reported as the field's name)."""
    found = INDEXED.match(error.field or "")
    name = found.group(2) if found else error.field
    message = error.message
    if found:
        message = message.removeprefix(f"{error.field}: ").removeprefix(f"[{found.group(1)}]")
    return line, name or None, message


@dataclass
class PreparedBatch:
    read: int  # records taken from the file (rows_read grows by this much)
    ready: list[tuple[int, Prepared]] = field(default_factory=list)  # (line, row) to write
    pending: list[Row] = field(default_factory=list)  # rows waiting for related records' ids
    rejected: list[Rejection] = field(default_factory=list)


@dataclass(frozen=True)
class _Column:
    index: int  # position in the CSV row
    parse: import_columns.CellParser  # import_columns.cell, for this column
    write: values.Writer  # values.write_value, for this column's field
    name: str  # the database column
    key: str  # the record JSON key (the path its errors name)


class CsvPlan:
    """CSV rows of plain columns to prepared rows (see the module's docstring).

    A row is converted in two passes, as the generic road does it: every cell through its
    column's parser first, then every value through its field's writer, so that the first
    error a row meets is the same. Columns whose cells are text skip the first pass, and
    columns whose parser already gives the written value skip the second."""

    def __init__(self, targets: list[Target | None], columns: list[_Column]) -> None:
        self._width = len(targets)
        self._names = [column.name for column in columns]
        self._fields = [column.key for column in columns]  # plain fields: key == name
        self._parsed = [(c.index, c.name, c.parse) for c in columns if c.parse is not None]
        self._written = [
            (c.index, c.name, c.write, c.key, True)
            if c.parse is not None
            else (c.index, c.name, _text_writer(c.write), c.key, False)
            for c in columns
            if not import_columns.written_as_parsed(c.parse, c.write)
        ]

    @classmethod
    def compile(cls, obj: ObjectModel, targets: list[Target | None]) -> CsvPlan | None:
        """The plan of a CSV whose columns all set distinct plain fields; None otherwise."""
        columns: list[_Column] = []
        for index, target in enumerate(targets):
            if target is None:
                continue
            item = target.item
            if (
                item is None
                or target.lookup is not None
                or target.part
                or item.is_system
                or item.is_many_to_one
                or len(item.columns) != 1  # a currency
                or obj.field(target.key) is not item
            ):
                return None
            column = _Column(
                index,
                import_columns.cell_parser(target),
                values.writer(item),
                item.column,
                target.key,
            )
            columns.append(column)
        if len({column.key for column in columns}) != len(columns):
            return None
        return cls(targets, columns)

    def prepare(self, create: CreatePlan, cells: list[str], ids: RecordIds) -> Prepared:
        """`import_columns.csv_row` then `CreatePlan.prepare`, without the record JSON between:
        the cells are typed in column order first, then checked as field values."""
        if len(cells) != self._width:
            raise values.fail("row", f"{len(cells)} columns where the header has {self._width}")
        row = dict.fromkeys(self._names)
        for index, name, parse in self._parsed:
            text = cells[index]
            if text != "":
                row[name] = parse(text)
        for index, name, write, key, parsed in self._written:
            if parsed:
                value = row[name]
                if value is not None:
                    row[name] = write(value, key)
            else:
                text = cells[index]
                if text != "":
                    row[name] = write(text, key)
        return create.complete(Prepared(row, list(self._fields)), None, "", ids)


def _text_writer(write: values.Writer) -> values.Writer:
    """A writer for cells that are text: `parse_string` checks only the text there."""
    return values.check_text if write is values.parse_string else write


class RowPreparer:
    """Prepares the records of one import job; used by one thread at a time."""

    def __init__(
        self,
        fmt: str,
        model: WorkspaceModel,
        obj: ObjectModel,
        targets: list[Target | None],
        create: CreatePlan,
    ) -> None:
        self._fmt = fmt
        self._model = model
        self._obj = obj
        self._targets = targets
        self.create = create
        self._plan = CsvPlan.compile(obj, targets) if fmt == CSV else None
        self.ids = RecordIds()

    def prepare(self, records: list[Record]) -> PreparedBatch:
        batch = PreparedBatch(len(records))
        for line, payload, error in records:
            if error:
                batch.rejected.append((line, None, error))
                continue
            try:
                if self._plan is not None:
                    batch.ready.append((line, self._plan.prepare(self.create, payload, self.ids)))
                    continue
                if self._fmt == CSV:
                    row = import_columns.csv_row(line, self._targets, payload)
                else:
                    row = import_columns.ndjson_row(self._model, self._obj, line, payload)
                if row.lookups:
                    batch.pending.append(row)
                else:
                    batch.ready.append((line, self.create.prepare(row.data, "", self.ids)))
            except ServiceError as exc:
                batch.rejected.append(rejection(line, exc))
        return batch

"""The stored upload of an import job read back as records, in constant memory.

The file is kept as ordered chunks (`records.import_chunks`). A parser thread reads them through
a file object whose reads fetch the next chunk on the event loop, so Python's C `csv` reader and
the UTF-8 decoder do the work; records are handed to the loop a batch at a time. Parsing is
deterministic, so a resumed job skips the records it already counted (`rows_read`).
"""

from __future__ import annotations

import asyncio
import codecs
import csv
import io
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, overload

from crmkit.errors import InvalidArgument

CSV, NDJSON = "csv", "ndjson"
FORMATS = (CSV, NDJSON)
CHUNK_BYTES = 1 << 20
T = TypeVar("T")
MAX_HEADER_BYTES = 1 << 20

# (line, cells) for CSV, (line, raw line) for NDJSON; or (line, error text) for a malformed one.
Record = tuple[int, Any, str]


class ChunkStream(io.RawIOBase):
    """A readable file over chunks 0, 1, ... returned by `fetch` (None past the last)."""

    def __init__(self, fetch: Callable[[int], bytes | None]) -> None:
        self._fetch = fetch
        self._seq = 0
        self._buffer = memoryview(b"")
        self._done = False

    def readable(self) -> bool:
        return True

    def readinto(self, target: Any) -> int:
        while not self._buffer:
            if self._done:
                return 0
            data = self._fetch(self._seq)
            if data is None:
                self._done = True
                return 0
            self._seq += 1
            self._buffer = memoryview(data)
        size = min(len(target), len(self._buffer))
        target[:size] = self._buffer[:size]
        self._buffer = self._buffer[size:]
        return size


def _text(stream: io.RawIOBase) -> io.TextIOWrapper:
    return io.TextIOWrapper(
        io.BufferedReader(stream, CHUNK_BYTES), encoding="utf-8-sig", newline=""
    )


def csv_records(stream: io.RawIOBase) -> Iterator[Record]:
    """Data records after the header row, each with the line it starts on; blank lines skipped."""
    reader = csv.reader(_text(stream), strict=True)
    try:
        next(reader)
    except StopIteration:
        return
    last = reader.line_num
    while True:
        try:
            cells = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            yield last + 1, None, f"malformed CSV: {exc}"
            last = reader.line_num
            continue
        if cells:
            yield last + 1, cells, ""
        last = reader.line_num


def ndjson_records(stream: io.RawIOBase) -> Iterator[Record]:
    for number, line in enumerate(io.BufferedReader(stream, CHUNK_BYTES), 1):
        if number == 1 and line.startswith(codecs.BOM_UTF8):
            line = line[len(codecs.BOM_UTF8) :]
        if line.strip():
            yield number, line, ""


def records_of(fmt: str, stream: io.RawIOBase) -> Iterator[Record]:
    return csv_records(stream) if fmt == CSV else ndjson_records(stream)


class Reader:
    """Records of a stored upload, fetched a batch at a time off the event loop."""

    def __init__(self, fmt: str, fetch: Callable[[int], Any]) -> None:
        loop = asyncio.get_running_loop()

        def fetch_now(seq: int) -> bytes | None:
            data: bytes | None = asyncio.run_coroutine_threadsafe(fetch(seq), loop).result()
            return data

        self._records = records_of(fmt, ChunkStream(fetch_now))

    def _take(self, count: int) -> list[Record]:
        taken: list[Record] = []
        for item in self._records:
            taken.append(item)
            if len(taken) >= count:
                break
        return taken

    @overload
    async def take(self, count: int) -> list[Record]: ...
    @overload
    async def take(self, count: int, then: Callable[[list[Record]], T]) -> T: ...
    async def take(self, count: int, then: Callable[[list[Record]], Any] | None = None) -> Any:
        """The next `count` records (fewer at the end), passed through `then` in the same
        thread when given."""

        def work() -> Any:
            taken = self._take(count)
            return taken if then is None else then(taken)

        return await asyncio.to_thread(work)

    async def skip(self, count: int) -> None:
        while count > 0:
            taken = await self.take(min(count, 10_000))
            if not taken:
                return
            count -= len(taken)


class UploadCheck:
    """Checks an upload as it arrives: UTF-8 (a BOM allowed) and, for CSV, the header row."""

    def __init__(self, fmt: str) -> None:
        self.format = fmt
        self.size = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")()
        self._head = bytearray()
        self.header: list[str] | None = None

    def feed(self, data: bytes, final: bool = False) -> None:
        try:
            self._decoder.decode(data, final)
        except UnicodeDecodeError as exc:
            offset = self.size + exc.start - len(self._decoder.getstate()[0])
            raise InvalidArgument(
                f"the file is not UTF-8 (invalid byte at offset {max(offset, 0)})", field="file"
            ) from None
        self.size += len(data)
        if self.format == CSV and self.header is None:
            self._head += data
            if b"\n" in self._head or final:
                self._parse_header(bytes(self._head))
            elif len(self._head) > MAX_HEADER_BYTES:
                raise InvalidArgument("the header row exceeds 1 MiB", field="file")

    def _parse_header(self, head: bytes) -> None:
        first = head.split(b"\n", 1)[0].removeprefix(codecs.BOM_UTF8).decode("utf-8", "replace")
        try:
            rows = list(csv.reader([first.rstrip("\r")], strict=True))
        except csv.Error as exc:
            raise InvalidArgument(f"the header row is not valid CSV: {exc}", field="file") from None
        header = rows[0] if rows else []
        if not header or all(not name.strip() for name in header):
            raise InvalidArgument("the CSV file needs a header row of field names", field="file")
        self.header = [name.strip() for name in header]
        self._head = bytearray()

    def finish(self) -> None:
        self.feed(b"", final=True)
        if self.size == 0:
            raise InvalidArgument("the file is empty", field="file")

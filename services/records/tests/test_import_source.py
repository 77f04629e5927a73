"""Reading a stored upload back: CSV records with the line each starts on, NDJSON lines, and the
checks an upload passes as it arrives."""

from __future__ import annotations

import pytest

from crmkit.errors import InvalidArgument
from records.import_source import (
    ChunkStream,
    UploadCheck,
    csv_records,
    ndjson_records,
)


def _stream(data: bytes, size: int = 3) -> ChunkStream:
    chunks = [data[i : i + size] for i in range(0, len(data), size)]
    return ChunkStream(lambda seq: chunks[seq] if seq < len(chunks) else None)


def test_csv_records_carry_their_first_line_across_chunks_bom_and_quoted_newlines() -> None:
    data = '\ufeffa,b\r\n1,"x\r\ny"\r\n\r\n2,"say ""hi"""\r\n3,é\r\n'.encode()
    assert list(csv_records(_stream(data))) == [
        (2, ["1", "x\r\ny"], ""),
        (5, ["2", 'say "hi"'], ""),
        (6, ["3", "é"], ""),
    ]


def test_a_malformed_csv_record_is_reported_with_its_line_and_reading_goes_on() -> None:
    records = list(csv_records(_stream(b'a,b\n1,2\n3,"4"x\n5,6\n', size=100)))
    assert records[0] == (2, ["1", "2"], "")
    assert records[1][0] == 3
    assert records[1][2].startswith("malformed CSV")
    assert records[-1] == (4, ["5", "6"], "")


def test_ndjson_lines_skip_blanks_and_a_bom() -> None:
    data = b'\xef\xbb\xbf{"a": 1}\n\n{"a": 2}\n'
    assert [(line, text.strip()) for line, text, _ in ndjson_records(_stream(data))] == [
        (1, b'{"a": 1}'),
        (3, b'{"a": 2}'),
    ]


def test_an_upload_check_refuses_bad_utf8_with_its_offset_and_reads_the_header() -> None:
    check = UploadCheck("csv")
    check.feed(b"\xef\xbb\xbfname, city \r\nAda,")
    assert check.header == ["name", "city"]
    with pytest.raises(InvalidArgument, match="offset 23"):
        check.feed(b"Lon\xffdon\r\n")
    empty = UploadCheck("ndjson")
    with pytest.raises(InvalidArgument, match="empty"):
        empty.finish()
    with pytest.raises(InvalidArgument, match="header row"):
        UploadCheck("csv").feed(b"\r\nAda\r\n")

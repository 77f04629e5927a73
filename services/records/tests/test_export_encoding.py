"""The export encoder: RFC 4180 CSV and NDJSON lines from the cursor's rows."""

from __future__ import annotations

import csv
import io

from crm.records.v1 import records_pb2
from records.export import Encoder


def test_csv_quotes_what_needs_quoting_and_ends_lines_with_crlf() -> None:
    encoder = Encoder(records_pb2.EXPORT_FORMAT_CSV)
    header = encoder.header(["id", "name", "amount.currencyCode"])
    body = encoder.rows([("1", 'Co, "quoted"\nline', None), ("2", "Zürich", "EUR")])
    assert header == b"id,name,amount.currencyCode\r\n"
    assert body == '1,"Co, ""quoted""\nline",\r\n2,Zürich,EUR\r\n'.encode()
    parsed = list(csv.reader(io.StringIO((header + body).decode(), newline="")))
    assert parsed[1] == ["1", 'Co, "quoted"\nline', ""]
    # The buffer is emptied after each call: nothing is repeated or kept.
    assert encoder.rows([("3", "x", "")]) == b"3,x,\r\n"


def test_ndjson_is_one_record_json_per_line_and_has_no_header() -> None:
    encoder = Encoder(records_pb2.EXPORT_FORMAT_NDJSON)
    assert encoder.header(["ignored"]) == b""
    assert encoder.rows([('{"id": "1"}',), ('{"id": "2"}',)]) == b'{"id": "1"}\n{"id": "2"}\n'
    assert encoder.rows([]) == b""

"""The limiter connection's RESP encoding and reply parsing (pure functions)."""

from __future__ import annotations

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from gateway.redis_connection import encode_command, parse_reply


def test_commands_are_arrays_of_bulk_strings() -> None:
    assert encode_command("EVALSHA", "ab", 1, b"k") == (
        b"*4\r\n$7\r\nEVALSHA\r\n$2\r\nab\r\n$1\r\n1\r\n$1\r\nk\r\n"
    )


def test_the_script_reply_parses_to_integers_and_the_next_reply_starts_after_it() -> None:
    first = b"*4\r\n:1\r\n:99\r\n:1700000060000000\r\n:1700000000000000\r\n"
    parsed = parse_reply(first + b"+OK\r\n", 0)
    assert parsed == ([1, 99, 1700000060000000, 1700000000000000], len(first))
    assert parse_reply(first + b"+OK\r\n", len(first)) == (b"OK", len(first) + 5)


@pytest.mark.parametrize(
    "partial",
    [b"", b"*2\r\n:1\r\n", b"$5\r\nhel", b"$5\r\nhello", b":12", b"*2\r\n$3\r\nabc\r\n$2\r\n"],
)
def test_an_incomplete_reply_waits_for_more_bytes(partial: bytes) -> None:
    assert parse_reply(partial, 0) is None


def test_bulk_null_and_nested_replies() -> None:
    assert parse_reply(b"$-1\r\n", 0) == (None, 5)
    assert parse_reply(b"$0\r\n\r\n", 0) == (b"", 6)
    assert parse_reply(b"*2\r\n*1\r\n$2\r\nhi\r\n:-3\r\n", 0) == ([[b"hi"], -3], 21)


def test_error_replies_are_returned_as_response_errors() -> None:
    parsed = parse_reply(b"-NOSCRIPT No matching script.\r\n", 0)
    assert parsed is not None
    error, _ = parsed
    assert isinstance(error, ResponseError)
    assert str(error).startswith("NOSCRIPT")


def test_an_unknown_reply_type_breaks_the_connection() -> None:
    with pytest.raises(RedisConnectionError):
        parse_reply(b"%1\r\n", 0)

"""The relay's messages in flight: JetStream's answers on the reply subscription, per record."""

from __future__ import annotations

from typing import Any

from nats.aio.msg import Msg
from opentelemetry import trace

from records.envelope import Message
from records.inflight import InFlight, ack_problem


def answer(data: bytes, headers: dict[str, str] | None = None) -> Msg:
    client: Any = None
    return Msg(client, subject="_INBOX.x.1x0", data=data, headers=headers)


def message(sequence: int, record_id: str = "") -> Message:
    return Message(sequence, record_id or f"r{sequence}", "crm.records.w.person.created", b"", {})


def test_ack_answers_are_read() -> None:
    assert ack_problem(answer(b'{"stream":"CRM_RECORDS","seq":7}')) == ""
    assert ack_problem(answer(b'{"stream":"CRM_RECORDS","seq":7,"duplicate":true}')) == ""
    refused = answer(b'{"error":{"code":503,"description":"insufficient resources"}}')
    assert ack_problem(refused) == "ack: insufficient resources"
    assert ack_problem(answer(b"", {"Status": "503"})).startswith("no stream")
    assert ack_problem(answer(b"not json")) == "ack: unreadable answer"


def test_a_records_next_message_waits_for_the_one_in_flight() -> None:
    flight = InFlight(3)
    first = flight.add(message(10, "a"), trace.INVALID_SPAN)
    assert first == "3x0"
    assert flight.blocks(message(11, "a"))
    assert not flight.blocks(message(12, "b"))
    flight.answer(first, answer(b'{"seq":1}'))
    assert not flight.blocks(message(11, "a"))
    assert flight.changed.is_set()
    assert flight.take_acknowledged() == [10]
    assert flight.take_acknowledged() == []


def test_a_failed_message_keeps_its_record_blocked_and_fails_the_run() -> None:
    flight = InFlight(1)
    token = flight.add(message(5, "a"), trace.INVALID_SPAN)
    flight.answer(token, answer(b'{"error":{"description":"boom"}}'))
    flight.answer(token, answer(b'{"seq":2}'))  # a second answer for one message is ignored
    assert flight.error == "ack: boom"
    assert flight.blocks(message(6, "a"))  # its later events never overtake it
    assert flight.acknowledged == []


def test_unanswered_messages_fail_the_run() -> None:
    flight = InFlight(1)
    flight.add(message(5), trace.INVALID_SPAN)
    assert flight.oldest() is not None
    flight.abandon("no acknowledgement in time")
    assert flight.acknowledged == []
    assert flight.error == "no acknowledgement in time"
    assert not flight.waiting
    assert flight.oldest() is None

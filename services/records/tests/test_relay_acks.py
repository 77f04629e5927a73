"""The relay's acknowledgements: JetStream's answers on the reply subscription, per wave."""

from __future__ import annotations

from typing import Any

from nats.aio.msg import Msg
from opentelemetry import trace

from records.envelope import Message
from records.relay import _ack_problem, _Wave


def answer(data: bytes, headers: dict[str, str] | None = None) -> Msg:
    client: Any = None
    return Msg(client, subject="_INBOX.x.1x0", data=data, headers=headers)


def message(sequence: int) -> Message:
    return Message(sequence, f"r{sequence}", "crm.records.w.person.created", b"", {})


def test_ack_answers_are_read() -> None:
    assert _ack_problem(answer(b'{"stream":"CRM_RECORDS","seq":7}')) == ""
    assert _ack_problem(answer(b'{"stream":"CRM_RECORDS","seq":7,"duplicate":true}')) == ""
    refused = answer(b'{"error":{"code":503,"description":"insufficient resources"}}')
    assert _ack_problem(refused) == "ack: insufficient resources"
    assert _ack_problem(answer(b"", {"Status": "503"})).startswith("no stream")
    assert _ack_problem(answer(b"not json")) == "ack: unreadable answer"


def test_a_wave_completes_once_sealed_and_every_message_answered() -> None:
    wave = _Wave(3)
    for index in range(2):
        wave.waiting[f"3x{index}"] = (message(10 + index), trace.INVALID_SPAN)
    wave.answer("3x0", answer(b'{"seq":1}'))
    assert not wave.complete.is_set()  # more messages may still be published
    wave.seal()
    assert not wave.complete.is_set()
    wave.answer("3x1", answer(b'{"error":{"description":"boom"}}'))
    wave.answer("3x1", answer(b'{"seq":2}'))  # a second answer for one message is ignored
    assert wave.complete.is_set()
    assert wave.acknowledged == [10]
    assert wave.error == "ack: boom"


def test_unanswered_messages_fail_the_wave() -> None:
    wave = _Wave(1)
    wave.waiting["1x0"] = (message(5), trace.INVALID_SPAN)
    wave.seal()
    wave.abandon("no acknowledgement in time")
    assert wave.acknowledged == []
    assert wave.error == "no acknowledgement in time"
    assert not wave.waiting

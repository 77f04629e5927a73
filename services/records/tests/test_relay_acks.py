"""The relay's messages in flight: JetStream's answers on the reply subscription, per record;
the publish frames written together."""

from __future__ import annotations

from collections import deque
from typing import Any

from nats.aio.msg import Msg
from opentelemetry import trace

from records.envelope import Message
from records.inflight import InFlight, ack_problem
from records.relay import OutboxRelay


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


class FakeNats:
    """The parts of nats-py's client the relay's publishing uses."""

    def __init__(self, connected: bool = True) -> None:
        self.is_closed = False
        self.is_draining_pubs = False
        self.is_connected = connected
        self._flush_queue = None
        self.writes: list[bytes] = []

    async def _send_command(self, command: bytes) -> None:
        self.writes.append(command)


def relay_with(nats: FakeNats) -> OutboxRelay:
    relay = OutboxRelay.__new__(OutboxRelay)
    relay._nats = nats  # type: ignore[assignment]
    relay._inbox = "_INBOX.r"
    return relay


async def test_queued_messages_go_out_in_order_together_until_a_record_waits() -> None:
    nats = FakeNats()
    relay = relay_with(nats)
    flight = InFlight(2)
    queue = deque([message(1, "a"), message(2, "b"), message(3, "a"), message(4, "c")])
    await relay._publish_queued(flight, queue, 100)
    assert [sequence for sequence, _ in flight_messages(flight)] == [1, 2]
    assert [m.sequence for m in queue] == [3, 4]  # 3 waits for 1 (same record), 4 behind it
    (write,) = nats.writes
    assert write.count(b"HPUB ") == 2
    assert write.index(b"_INBOX.r.2x0") < write.index(b"_INBOX.r.2x1")


async def test_large_bursts_are_written_in_chunks() -> None:
    nats = FakeNats()
    relay = relay_with(nats)
    flight = InFlight(1)
    big = [
        Message(n, f"r{n}", "crm.records.w.person.created", b"x" * 100_000, {}) for n in range(6)
    ]
    await relay._publish_queued(flight, deque(big), 100)
    assert len(flight.waiting) == 6
    assert len(nats.writes) == 2  # a write once 256 KiB are queued, then the rest
    assert b"".join(nats.writes).count(b"HPUB ") == 6


async def test_nothing_is_sent_while_nats_is_away() -> None:
    relay = relay_with(FakeNats(connected=False))
    flight = InFlight(1)
    queue = deque([message(1, "a"), message(2, "b")])
    await relay._publish_queued(flight, queue, 100)
    assert not flight.waiting
    assert flight.error.startswith("publish: PublishFailed")
    assert flight.blocks(message(5, "a"))  # its record stays blocked for the rest of the run
    assert flight.acknowledged == []


def flight_messages(flight: InFlight) -> list[tuple[int, str]]:
    return [(m.sequence, m.record_id) for m, _, _ in flight.waiting.values()]


def test_a_batch_in_flight_blocks_each_of_its_records_and_acknowledges_all() -> None:
    batch = Message(1, "r1", "crm.records.w.person.created", b"", {}, ((2, "r2"), (3, "r3")))
    flight = InFlight(1)
    token = flight.add(batch, trace.INVALID_SPAN)
    later = Message(9, "r2", batch.subject, b"", {})
    assert flight.blocks(later)
    assert not flight.blocks(Message(10, "r7", batch.subject, b"", {}))
    flight.answer(token, answer(b'{"seq":1}'))
    assert not flight.blocks(later)
    assert flight.take_acknowledged() == [1, 2, 3]

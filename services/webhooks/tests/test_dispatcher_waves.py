"""How many due deliveries the dispatcher claims for a target at a time (its wave), and when new
rows wake a claim: pure logic of webhooks.dispatcher, no database."""

from __future__ import annotations

from typing import Any, cast

from webhooks.dispatcher import Dispatcher
from webhooks.settings import WebhooksSettings
from webhooks.slots import Kind


def _dispatcher(**settings: Any) -> Dispatcher:
    config = WebhooksSettings.model_construct(**settings)
    none = cast(Any, None)  # the database, sender and readers are not touched here
    return Dispatcher(config, none, none, none, none, none, none)


def _hold(dispatcher: Dispatcher, kind: Kind, **held: int) -> None:
    for target, count in held.items():
        dispatcher._held[kind][f"https://{target}"] = count


def test_a_lone_busy_target_is_claimed_for_a_quarter_of_the_room_at_a_time() -> None:
    dispatcher = _dispatcher()  # 64 attempts per process (a room of 128 of each kind), 8 per target
    assert dispatcher.wave(Kind.FIRST) == 32
    _hold(dispatcher, Kind.FIRST, a=60)
    assert dispatcher.wave(Kind.FIRST) == 32
    assert dispatcher.wave(Kind.RETRY) == 32  # each kind has its own room
    _hold(dispatcher, Kind.FIRST, b=1)
    assert dispatcher.wave(Kind.FIRST) == 21
    _hold(dispatcher, Kind.FIRST, c=1)
    assert dispatcher.wave(Kind.FIRST) == 16
    _hold(dispatcher, Kind.FIRST, **{f"t{n}": 1 for n in range(20)})
    assert dispatcher.wave(Kind.FIRST) == 8  # never less than the per-target concurrency
    room = dispatcher._room(Kind.FIRST)
    assert room.wave == 8
    assert room.total == 128 - 60 - 1 - 1 - 20


def test_the_wave_is_never_below_the_per_target_concurrency() -> None:
    dispatcher = _dispatcher(WEBHOOK_MAX_CONCURRENCY=16, WEBHOOK_MAX_CONCURRENCY_PER_TARGET=12)
    assert dispatcher.wave(Kind.FIRST) == 12  # 32 // 4 = 8 would starve its own slots


def test_new_rows_of_a_target_with_a_full_wave_queued_wake_no_claim() -> None:
    """Such a claim would leave the target out after reading past its whole due backlog; the end
    of its attempts wakes the dispatcher once it is down to one wave."""
    dispatcher = _dispatcher()
    _hold(dispatcher, Kind.FIRST, busy=40)
    dispatcher.adopt([], {"https://busy"})
    assert not dispatcher._wake.is_set()
    _hold(dispatcher, Kind.FIRST, busy=32)
    dispatcher.adopt([], {"https://busy"})
    assert dispatcher._wake.is_set()


def test_new_rows_of_a_target_with_room_wake_a_claim_beside_a_full_one() -> None:
    dispatcher = _dispatcher()
    _hold(dispatcher, Kind.FIRST, busy=64)
    dispatcher.adopt([], {"https://busy", "https://other"})
    assert dispatcher._wake.is_set()

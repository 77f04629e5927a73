"""The per-process attempt counters used while Redis is unreachable behave as the Redis script."""

from __future__ import annotations

from identity.brute_force import LocalCounters, Rule


def test_a_full_counter_refuses_until_its_window_ends() -> None:
    counters = LocalCounters()
    rules = [Rule(limit=2, window=60)]
    assert counters.acquire(["k"], rules, now=0) == 0
    assert counters.acquire(["k"], rules, now=1) == 0
    assert counters.acquire(["k"], rules, now=2) == 58  # seconds until the window ends
    assert counters.acquire(["k"], rules, now=61) == 0  # a new window


def test_refused_attempts_reserve_nothing_and_successes_give_their_slot_back() -> None:
    counters = LocalCounters()
    rules = [Rule(limit=1, window=60), Rule(limit=5, window=60)]
    assert counters.acquire(["pair", "ip"], rules, now=0) == 0
    assert counters.acquire(["pair", "ip"], rules, now=0) > 0  # "pair" is full: nothing counted
    counters.release(["pair", "ip"])  # the attempt was right
    assert counters.acquire(["pair", "ip"], rules, now=0) == 0
    for _ in range(4):
        assert counters.acquire(["other", "ip"], [Rule(10, 60), rules[1]], now=0) == 0
    assert counters.acquire(["third", "ip"], [Rule(10, 60), rules[1]], now=0) > 0  # ip: 5 used

"""crmkit.heap: what startup built is frozen, garbage is not, and later cycles are still
collected. Run in a child interpreter: freezing is process-wide."""

from __future__ import annotations

import subprocess
import sys
import textwrap

PROGRAM = textwrap.dedent(
    """
    import gc, weakref
    from crmkit.heap import YOUNG_THRESHOLD, tune_after_startup

    class Node:
        pass

    def cycle():
        a, b = Node(), Node()
        a.other, b.other = b, a
        return weakref.ref(a)

    kept = [Node()]
    dropped_before = cycle()
    tune_after_startup()
    assert dropped_before() is None, "garbage from before startup was frozen"
    assert gc.get_freeze_count() > 0
    assert not any(o is kept for o in gc.get_objects()), "startup objects not frozen"
    assert gc.get_threshold()[0] == YOUNG_THRESHOLD
    dropped_after = cycle()
    gc.collect()
    assert dropped_after() is None, "a cycle made after startup was not collected"
    print("ok")
    """
)


def test_startup_heap_is_frozen_and_later_cycles_are_collected() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"

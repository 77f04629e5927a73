"""How long the launcher waits before restarting a process that died (services and servers)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class RestartBackoff:
    """0.5 s after the first crash, doubling with each crash that follows within `healthy_after`
    seconds of its restart, at most `cap`; a process that ran `healthy_after` starts again at
    `first`."""

    first: float = 0.5
    cap: float = 10.0
    healthy_after: float = 30.0
    _crashes: dict[str, int] = field(default_factory=dict)

    def delay(self, name: str, started_at: float, now: float | None = None) -> float:
        """The wait before restarting `name`, which (re)started at `started_at` (monotonic)."""
        now = time.monotonic() if now is None else now
        crashes = 0 if now - started_at >= self.healthy_after else self._crashes.get(name, 0)
        self._crashes[name] = crashes + 1
        return float(min(self.cap, self.first * 2**crashes))

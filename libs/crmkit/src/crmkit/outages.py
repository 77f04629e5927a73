"""A dependency's outage, logged once rather than once per request.

The first failure of an outage logs a warning (and counts one outage); while it lasts, one
reminder a minute says how many calls it failed; the first success after it logs the recovery.
So a PostgreSQL, Redis or NATS outage costs a few log lines, whatever the request rate.
"""

from __future__ import annotations

import logging
import time

from prometheus_client import Counter

REMINDER_SECONDS = 60.0


class OutageLog:
    def __init__(
        self,
        dependency: str,
        logger: logging.Logger,
        counter: Counter | None = None,
        *,
        reminder_seconds: float = REMINDER_SECONDS,
    ) -> None:
        self.dependency = dependency
        self._log = logger
        self._counter = counter
        self._reminder = reminder_seconds
        self._since: float | None = None
        self._reminded = 0.0
        self._failures = 0

    @property
    def down(self) -> bool:
        return self._since is not None

    def failed(self, error: BaseException | str) -> None:
        """A call failed because the dependency is unreachable."""
        now = time.monotonic()
        self._failures += 1
        if self._since is None:
            self._since = self._reminded = now
            if self._counter is not None:  # labelled by the name before any "(what for)"
                self._counter.labels(self.dependency.split(" (", 1)[0]).inc()
            self._log.warning(
                "%s unavailable (logged once per outage): %s",
                self.dependency,
                first_line(error),
                extra={"dependency": self.dependency},
            )
        elif now - self._reminded >= self._reminder:
            self._reminded = now
            self._log.warning(
                "%s still unavailable after %.0f s, %d calls failed",
                self.dependency,
                now - self._since,
                self._failures,
                extra={"dependency": self.dependency},
            )

    def recovered(self) -> None:
        """A call reached the dependency (cheap when it was not down)."""
        if self._since is None:
            return
        self._log.warning(
            "%s available again after %.1f s, %d calls failed",
            self.dependency,
            time.monotonic() - self._since,
            self._failures,
            extra={"dependency": self.dependency},
        )
        self._since = None
        self._failures = 0


def first_line(error: BaseException | str) -> str:
    text = error if isinstance(error, str) else (str(error) or type(error).__name__)
    lines = text.splitlines()
    return (lines[0] if lines else text)[:200]

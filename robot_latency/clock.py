"""The one clock every timing field is read from.

A clock is any zero-argument callable returning integer nanoseconds on a monotonic scale.
Production code uses ``time.perf_counter_ns``; tests inject a :class:`ScriptedClock`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Protocol, runtime_checkable

Clock = Callable[[], int]

#: The default clock: monotonic, nanoseconds, highest resolution available.
DEFAULT_CLOCK: Clock = time.perf_counter_ns


@runtime_checkable
class WaitingClock(Protocol):
    """A clock that waits in its own time (a scripted clock moves forward instead of sleeping)."""

    def __call__(self) -> int: ...

    def sleep_until(self, target_ns: int) -> None: ...

    def sleep_for(self, delta_ns: int) -> None: ...


def sleep_until_for(clock: Clock) -> Callable[[int], None]:
    """Return how to wait until ``target_ns`` on ``clock``: its own ``sleep_until`` when it has
    one (:class:`WaitingClock`), else a real sleep for the time left on it."""
    if isinstance(clock, WaitingClock):
        return clock.sleep_until

    def real(target_ns: int) -> None:
        delay = target_ns - clock()
        if delay > 0:
            time.sleep(delay / 1e9)
    return real


class ScriptedClock:
    """A clock that only moves when told to, for deterministic tests.

    Each call returns the current time; :meth:`advance` moves it forward. A script of per-call
    steps can also be given: each call then returns the current time and advances by the next step.
    """

    def __init__(self, start_ns: int = 0, *, steps_ns: Iterable[int] = ()) -> None:
        self._now_ns = int(start_ns)
        self._steps = list(steps_ns)
        self.calls = 0

    def __call__(self) -> int:
        now = self._now_ns
        if self.calls < len(self._steps):
            self._now_ns += int(self._steps[self.calls])
        self.calls += 1
        return now

    def advance(self, delta_ns: int) -> int:
        """Move the clock forward by ``delta_ns`` (>= 0) and return the new time."""
        if delta_ns < 0:
            raise ValueError(f"a clock cannot go back: delta_ns={delta_ns}")
        self._now_ns += int(delta_ns)
        return self._now_ns

    def now(self) -> int:
        """Return the current time without counting a call."""
        return self._now_ns

    def sleep_for(self, delta_ns: int) -> None:
        """Wait ``delta_ns``: move on by it at once (not a call: no scripted step is taken)."""
        self.advance(delta_ns)

    def sleep_until(self, target_ns: int) -> None:
        """Wait until ``target_ns``: move there at once (never back)."""
        if target_ns > self._now_ns:
            self._now_ns = int(target_ns)

"""The time the controller lives by: the wall clock, or a faster one for a replay.

The controller (its attempt loop, capacity waits, lease, progress watch, billing and the
record's timestamps) reads time and waits only through `clock()`. A process that replays a
long job against a spot trace (bench/spotmarket.py) installs a `ScaledClock` with
`use_clock`, and the same controller code then lives through days of simulated time in
minutes: every timeout, interval and duration it has is in the clock's seconds.

Waits on a queue or an event (which take a timeout in real seconds) convert through
`real_seconds`.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator


class Clock:
    """The wall clock."""

    def time(self) -> float:
        """Seconds since the epoch (timestamps in records, leases, billing)."""
        return time.time()

    def monotonic(self) -> float:
        """Seconds for intervals and deadlines."""
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def real_seconds(self, seconds: float) -> float:
        """How many wall-clock seconds `seconds` of this clock take (a queue's timeout)."""
        return seconds


class ScaledClock(Clock):
    """A clock `speed` times faster than the wall clock, starting at `epoch` (default: now).

    Its time is the wall clock's elapsed time times `speed`, so whatever the code under it
    spends (a store write, a thread switch) passes `speed` times faster too: at 1000x, a
    millisecond of work is a simulated second. A replay picks a speed at which that is small
    next to what it measures.
    """

    def __init__(self, speed: float, epoch: float | None = None) -> None:
        if speed <= 0:
            raise ValueError(f"speed must be positive, not {speed}")
        self.speed = speed
        self._wall0 = time.monotonic()
        self._epoch0 = time.time() if epoch is None else epoch

    def _elapsed(self) -> float:
        return (time.monotonic() - self._wall0) * self.speed

    def time(self) -> float:
        return self._epoch0 + self._elapsed()

    def monotonic(self) -> float:
        return self._elapsed()

    def sleep(self, seconds: float) -> None:
        time.sleep(max(0.0, seconds) / self.speed)

    def real_seconds(self, seconds: float) -> float:
        return seconds / self.speed


_WALL = Clock()
_current: Clock = _WALL
_lock = threading.Lock()


def clock() -> Clock:
    """The clock this process lives by (the wall clock unless a replay installed another)."""
    return _current


@contextlib.contextmanager
def use_clock(new: Clock) -> Iterator[Clock]:
    """Live by `new` for the block: every thread of this process, the controller's too."""
    global _current
    with _lock:
        before, _current = _current, new
    try:
        yield new
    finally:
        with _lock:
            _current = before

"""Background work of the training helpers that must finish before the process ends.

Threads are non-daemon, so a normal interpreter exit waits for them; `finish()` ends the
process with os._exit, which would not, so it calls `join_all()` first. Likewise what is
to run as the process ends (`at_end`): atexit handlers, which `finish()` runs itself.
"""

from __future__ import annotations

import atexit
import sys
import threading
from collections.abc import Callable

_lock = threading.Lock()
_pending: set[threading.Thread] = set()
_at_end: list[Callable[[], None]] = []


def start(name: str, work: Callable[[], None]) -> threading.Thread:
    """Run `work` in a thread that `join_all` waits for; a failure is reported, not raised."""

    def run() -> None:
        try:
            work()
        except Exception as e:  # durability is best effort; the store's copy is the real one
            print(f"[trainctl.train] {name}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)

    thread = threading.Thread(target=run, name=name, daemon=False)
    with _lock:
        _pending.add(thread)
    thread.start()
    return thread


def forget(thread: threading.Thread) -> None:
    with _lock:
        _pending.discard(thread)


def join_all() -> None:
    """Wait for every started thread."""
    with _lock:
        threads = list(_pending)
        _pending.clear()
    for thread in threads:
        thread.join()


def at_end(work: Callable[[], None]) -> None:
    """Run `work` as the process ends: at interpreter exit, or in `finish()` (run_at_end)."""
    if work not in _at_end:
        _at_end.append(work)
        atexit.register(work)


def run_at_end() -> None:
    """What `at_end` registered, now (finish() ends the process without atexit)."""
    for work in list(_at_end):
        work()

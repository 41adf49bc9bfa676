"""Background work of the training helpers that must finish before the process ends.

Threads are non-daemon, so a normal interpreter exit waits for them; `finish()` ends the
process with os._exit, which would not, so it calls `join_all()` first.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

_lock = threading.Lock()
_pending: set[threading.Thread] = set()


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

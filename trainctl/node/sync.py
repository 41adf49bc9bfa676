"""What the node's two syncs to the store share (checkpoints: node.checkpoints; the working
directory: node.workdir): a background pass every few seconds or when woken, one final pass
on close, and parallel downloads with a progress line for a long restore."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from trainctl.errors import NotFoundError
from trainctl.node.priority import yield_cpu_to_training
from trainctl.store import Store

Signature = tuple[int, int]  # (size, mtime_ns)

RESTORE_REPORT_SECONDS = 5.0


def size_text(n: int) -> str:
    """Bytes as a person reads them (11.0 kB, 2.1 MB): rich's wording, which nodes lack."""
    for unit in ("bytes", "kB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def signature(path: Path) -> Signature | None:
    """(size, mtime_ns) of a regular file that is no link; None otherwise or if it is gone."""
    try:
        st = path.lstat()
    except OSError:
        return None
    if not path.is_file() or path.is_symlink():
        return None
    return (st.st_size, st.st_mtime_ns)


def download_all(
    store: Store,
    items: dict[str, Path],
    log: Callable[[str], None],
    *,
    what: str,
    sizes: dict[str, int] | None = None,
) -> dict[str, Signature]:
    """Download store key -> local path, 8 at a time; returns key -> local signature for the
    keys that arrived (a key pruned meanwhile is skipped). A long restore says how far it is
    every RESTORE_REPORT_SECONDS in the node log, where its user sees it (a terminal, a
    notebook or the dashboard)."""
    restored: dict[str, Signature] = {}
    total = sum((sizes or {}).values())
    received = [0]
    lock = threading.Lock()
    started = time.monotonic()
    next_report = [started + RESTORE_REPORT_SECONDS]

    def advance(n: int) -> None:
        with lock:
            received[0] += n
            now = time.monotonic()
            if now < next_report[0] or not total:
                return
            next_report[0] = now + RESTORE_REPORT_SECONDS
            done = received[0]
        log(
            f"{what}: restoring {done / 2**20:.0f} of {total / 2**20:.0f} MiB "
            f"({100 * done / total:.0f} %, {done / 2**20 / (now - started):.0f} MiB/s)"
        )

    def fetch(key: str) -> None:
        path = items[key]
        try:
            store.get_file(key, path, progress=advance)
        except NotFoundError:
            return  # pruned by a node after its manifest was read
        st = path.stat()
        restored[key] = (st.st_size, st.st_mtime_ns)

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(fetch, sorted(items)))
    return restored


def upload_present(store: Store, items: list[tuple[str, Path]], *, workers: int = 8) -> set[str]:
    """Upload (key, path) pairs; the keys that went up. A file deleted since it was listed
    (a checkpoint step the script pruned) is left out, not an error: the next pass sees it
    gone. Any other failure is raised."""
    if not items:
        return set()
    try:
        store.put_files(items, workers=workers)
        return {key for key, _ in items}
    except Exception:
        if all(path.exists() for _, path in items):
            raise
    done: set[str] = set()
    for key, path in items:  # one by one, to leave out only what vanished
        try:
            store.put_file(key, path)
            done.add(key)
        except Exception:
            if path.exists():
                raise
    return done


class PeriodicSync:
    """A `sync_once` pass in a background thread every `interval` seconds, or at once when
    woken; `close()` stops the thread and runs one last pass (what was written just before
    the node ended goes up too). Subclasses write `sync_once`."""

    name = "sync"

    def __init__(self, *, interval: float, log: Callable[[str], None]) -> None:
        self.interval = interval
        self.log = log
        self._lock = threading.Lock()  # one pass at a time (the thread vs. the final flush)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)

    def start(self):
        self._thread.start()
        return self

    def _run(self) -> None:
        yield_cpu_to_training()
        while True:
            self._wake.wait(self.interval)
            self._wake.clear()
            if self._stop.is_set():  # close() makes the last pass itself
                return
            try:
                with self._lock:
                    self.sync_once()
            except Exception as exc:  # the store retries; a failed pass is retried next time
                self.log(f"{self.name} failed (will retry): {exc}")

    def wake(self) -> None:
        """Sync now: the script says it saved something (don't wait for the next poll)."""
        self._wake.set()

    def sync_once(self) -> int:
        raise NotImplementedError

    def halt(self) -> None:
        """Stop the background pass (one under way finishes first)."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=60)

    def close(self) -> None:
        """Stop the background pass and flush what is left."""
        self.halt()
        with self._lock:
            self.sync_once()

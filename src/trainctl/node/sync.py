"""What the node's two syncs to the store share (checkpoints: node.checkpoints; the working
directory: node.workdir): a background pass every few seconds or when woken, one final pass
on close, parallel downloads with a progress line for a long restore, and the check that
keeps a file cut off mid-write from replacing its last whole copy."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import struct
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from trainctl.errors import NotFoundError
from trainctl.node.priority import yield_cpu_to_training
from trainctl.store import Store, safefs

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


# What a training script saves in place and a copy must not catch half-written: an empty
# one of these is never a whole file. (A write is buffered: what a cut leaves is empty or
# at least the first block, which holds the start a format is known by.)
TORCH_SAVE_SUFFIXES = (".pt", ".pth", ".ckpt", ".bin", ".tar")
SAVED_STATE_SUFFIXES = frozenset(
    (*TORCH_SAVE_SUFFIXES, ".safetensors", ".npz", ".npy", ".pkl", ".pickle", ".joblib", ".h5")
)
ZIP_START = b"PK\x03\x04"
ZIP_END = b"PK\x05\x06"
ZIP_END_SIZE = 22  # the end-of-central-directory record, before its comment (<= 65535)
# torch.save's legacy (non-zip) format opens with a pickled magic number and ends with raw
# tensor bytes, not a pickle's STOP: never judged as a pickle.
TORCH_LEGACY_START = b"\x80\x02\x8a\x0a"
SAFETENSORS_HEADER_MAX = 100 * 2**20


def unfinished(path: Path, size: int) -> str | None:
    """Why the `size`-byte file at `path` cannot be whole, or None. A script that saves in
    place (`torch.save(state, "snapshot.pt")`) truncates the file and then writes it: a copy
    taken in between, or after a stop cut the write short, is torn. Where the format says
    where it ends, the end is checked: a zip (torch.save, np.savez, Keras) ends with its
    end-of-central-directory record, a safetensors file is as long as its header says, a
    pickle ends with STOP, and a saved-state file (SAVED_STATE_SUFFIXES) is never empty.
    Other files: None (the size and time checks around an upload are all there is)."""
    suffix = path.suffix.lower()
    if size == 0:
        return "empty" if suffix in SAVED_STATE_SUFFIXES else None
    try:
        with path.open("rb") as f:
            head = f.read(8)
            if head.startswith(ZIP_START):
                return None if _zip_ends_at(f, size) else "a zip without its end record"
            if suffix == ".safetensors" and len(head) == 8:
                return _safetensors_short(f, size, struct.unpack("<Q", head)[0])
            if suffix in (".pkl", ".pickle") and head[:1] == b"\x80":
                if head.startswith(TORCH_LEGACY_START):
                    return None
                f.seek(size - 1)
                return None if f.read(1) == b"." else "a pickle without its end"
    except OSError:
        return None  # gone or unreadable now: the upload finds out
    return None


def _zip_ends_at(f, size: int) -> bool:
    """Whether the end record of the zip `f` is its last bytes (with its comment, if any)."""
    span = min(size, ZIP_END_SIZE + 65535)
    f.seek(size - span)
    tail = f.read(span)
    at = tail.rfind(ZIP_END)
    while at >= 0:  # tensor bytes may hold the signature by chance: the lengths must agree
        if at + ZIP_END_SIZE <= len(tail):
            (comment,) = struct.unpack("<H", tail[at + 20 : at + 22])
            if at + ZIP_END_SIZE + comment == len(tail):
                return True
        at = tail.rfind(ZIP_END, 0, at)
    return False


def _safetensors_short(f, size: int, header_size: int) -> str | None:
    """Why a safetensors file is shorter than its header says, or None."""
    if 8 + header_size > size:
        return "a safetensors file shorter than its header"
    if header_size > SAFETENSORS_HEADER_MAX:
        return None  # not a header this check reads: no verdict
    try:
        header = json.loads(f.read(header_size))
        end = max(
            (int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"),
            default=0,
        )
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return None
    return "a safetensors file shorter than its tensors" if size < 8 + header_size + end else None


def frozen_copy(path: Path, dest: Path, root: Path | None = None) -> Signature | None:
    """Copy `path` to `dest` and return the signature of the version copied, or None when
    the file changed while it was copied, is gone or is not whole: the copy is then of no
    one version and is removed. A copy that fails (no room) raises OSError. For a file
    rewritten in place more often than its upload takes (a `snapshot.pt` saved every epoch
    to a slow store): a local copy takes a fraction of the upload's time, and what goes up
    is the copy, which nothing rewrites. `root`: the folder `path` is in, below which no
    link is followed (see held)."""
    before = signature(path)
    if before is None:
        return None
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        with held([("", path)], [root] if root else []) as opened:
            if not opened:
                return None  # a link now, or gone
            shutil.copyfile(opened[0][1], dest)
    except FileNotFoundError:
        dest.unlink(missing_ok=True)
        return None  # removed meanwhile
    except OSError:
        dest.unlink(missing_ok=True)
        raise
    if signature(path) != before or unfinished(dest, before[0]) is not None:
        dest.unlink(missing_ok=True)
        return None
    return before


def download_all(
    store: Store,
    items: dict[str, Path],
    log: Callable[[str], None],
    *,
    what: str,
    sizes: dict[str, int] | None = None,
    root: Path | None = None,
) -> dict[str, Signature]:
    """Download store key -> local path, 8 at a time; returns key -> local signature for the
    keys that arrived (a key pruned meanwhile is skipped). A long restore says how far it is
    every RESTORE_REPORT_SECONDS in the node log, where its user sees it (a terminal, a
    notebook or the dashboard). With `root` (every path below it), each file is written
    into its folder opened below `root` following no link: a link left in a folder that
    outlives its attempt (a persistent checkpoint_local_path) is replaced, not written
    through (it could lead to the store, which the script's own view hides)."""
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
        with _in_own_folder(items[key], root) as path:
            try:
                store.get_file(key, path, progress=advance)
            except NotFoundError:
                return  # pruned by a node after its manifest was read
            st = path.stat()
            restored[key] = (st.st_size, st.st_mtime_ns)

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(fetch, sorted(items)))
    return restored


@contextlib.contextmanager
def _in_own_folder(path: Path, root: Path | None) -> Iterator[Path]:
    """`path`, or with `root` the same file named through its folder's descriptor, the
    folder opened (and made) below `root` with safefs.make_dirs."""
    if root is None or not os.path.isdir("/proc/self/fd"):
        yield path
        return
    *folders, name = path.relative_to(root).parts
    fd = safefs.make_dirs(root, folders)
    try:
        yield Path(f"/proc/self/fd/{fd}") / name
    finally:
        os.close(fd)


@contextlib.contextmanager
def held(items: list[tuple[str, Path]], roots: list[Path]) -> Iterator[list[tuple[str, Path]]]:
    """The (key, path) pairs whose path is below one of `roots`, each opened there following
    no link and given as its descriptor's /proc/self/fd path: a script that swaps a file it
    saved, or a folder above it, for a link between the scan and the upload (to the store,
    which its own view of the machine hides) gets nothing of where the link leads uploaded.
    What is gone, a link or not a regular file is left out (the caller sees it missing)."""
    if not roots or not os.path.isdir("/proc/self/fd"):  # (no /proc: the paths as they are)
        yield items
        return
    fds: list[int] = []
    found: list[tuple[str, Path]] = []
    real = {root: root.resolve() for root in roots}  # (the roots as named may be links)
    try:
        for key, path in items:
            root = next((r for r in roots if path.is_relative_to(r)), None)
            if root is None:
                continue
            try:
                fd = safefs.open_file(real[root], path.relative_to(root).as_posix())
            except (OSError, ValueError):
                continue
            fds.append(fd)
            found.append((key, Path(f"/proc/self/fd/{fd}")))
        yield found
    finally:
        for fd in fds:
            os.close(fd)


def upload_present(
    store: Store,
    items: list[tuple[str, Path]],
    *,
    workers: int = 8,
    roots: list[Path] | None = None,
) -> set[str]:
    """Upload (key, path) pairs; the keys that went up. A file deleted since it was listed
    (a checkpoint step the script pruned) is left out, not an error: the next pass sees it
    gone. Any other failure is raised. `roots`: the folders the paths are in, which the
    script writes to: each file is read following no link below them (see held)."""
    if not items:
        return set()
    if roots:
        with held(items, roots) as opened:
            return _upload(store, opened, workers)
    return _upload(store, items, workers)


def _upload(store: Store, items: list[tuple[str, Path]], workers: int) -> set[str]:
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
    the node ended goes up too). Subclasses write `sync_once`, and call `stored_state(files)`
    when a pass has put saved training state in the store (what a relaunch resumes from)."""

    name = "sync"

    def __init__(
        self,
        *,
        interval: float,
        log: Callable[[str], None],
        on_state: Callable[[], None] | None = None,
    ) -> None:
        self.interval = interval
        self.log = log
        self._on_state = on_state
        self.stored_files = 0  # saved-state files this sync stored (see stored_state)
        self._lock = threading.Lock()  # one pass at a time (the thread vs. the final flush)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._patient: Store | None = None
        self._prompt: Store | None = None
        # The stored manifest is behind what this node knows it stored (its write failed):
        # the next pass writes it, even with nothing new to upload.
        self._manifest_behind = False

    @property
    def store(self) -> Store:
        """The store a pass writes to: a background pass's requests give up quickly (the
        next pass retries, see Store.prompt); the last pass, the node's last word, is patient."""
        assert self._patient is not None and self._prompt is not None
        return self._patient if self.last_pass else self._prompt

    @store.setter
    def store(self, store: Store) -> None:
        self._patient, self._prompt = store, store.prompt()

    def start(self):
        self._thread.start()
        return self

    def _run(self) -> None:
        yield_cpu_to_training()
        failed, since = 0, 0.0
        while True:
            self._wake.wait(self.interval)
            self._wake.clear()
            if self._stop.is_set():  # close() makes the last pass itself
                return
            try:
                with self._lock:
                    self.sync_once()
            except Exception as exc:  # a failed pass is retried next time
                if not failed:  # said once an outage, not every pass of it
                    since = time.monotonic()
                    self.log(f"{self.name} failed (retried every {self.interval:g} s): {exc}")
                failed += 1
                continue
            if failed:
                self.log(
                    f"{self.name} works again after {failed} failed pass(es) in "
                    f"{time.monotonic() - since:.1f} s"
                )
                failed = 0

    def stored_state(self, files: int) -> None:
        """A pass put `files` more saved-state files in the store: tell `on_state`."""
        self.stored_files += files
        if self._on_state is not None and files:
            self._on_state()

    def wake(self) -> None:
        """Sync now: the script says it saved something (don't wait for the next poll)."""
        self._wake.set()

    def sync_once(self) -> int:
        raise NotImplementedError

    @property
    def last_pass(self) -> bool:
        """Whether the pass under way is close()'s: the node has ended."""
        return self._stop.is_set()

    def whole_only(
        self,
        changed: list[str],
        local: Callable[[str], Path | None],
        sizes: dict[str, Signature],
        *,
        shown: Callable[[str], str],
        kept: Callable[[str], bool],
        what: str,
    ) -> list[str]:
        """`changed` less the files that cannot be whole (see unfinished): their last whole
        copy stays the stored one, and a later pass takes them when they are finished. The
        last pass says which it left out: a write the node's end cut short."""
        whole: list[str] = []
        for rel in changed:
            path = local(rel)
            why = None if path is None else unfinished(path, sizes[rel][0])
            if why is None:
                whole.append(rel)
            elif self.last_pass:
                self.log(
                    f"{what}: {shown(rel)} was being written when the node stopped ({why}); "
                    + ("its last whole copy is kept" if kept(rel) else "not kept")
                )
        return whole

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

"""A store rooted at a local directory (file:// URIs).

Whole-object writes go to a hidden temp file in the destination directory and are then renamed
over the target with os.replace, which is atomic on POSIX: readers see the old object or the new
one, never a torn write. Temp files are named `.<name>.tmp-<random>` so that `list` can skip them.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import secrets
import shutil
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from trainctl.errors import NotFoundError, StoreError
from trainctl.spec.uris import clean_key
from trainctl.store.base import ObjectInfo, Progress, Store

_TMP_MARK = ".tmp-"
# Objects are readable by their owner only: a job's record and logs may hold its secrets
# (environment values, hyperparameters), and the store is the user's, not the machine's.
FILE_MODE = 0o600
_PARENT_RETRIES = 10


def _is_tmp(name: str) -> bool:
    return name.startswith(".") and _TMP_MARK in name


def _tmp_sibling(path: Path) -> Path:
    return path.with_name(f".{path.name}{_TMP_MARK}{secrets.token_hex(6)}")


class LocalStore(Store):
    """Objects are plain files under `root`; 'directories' are real directories."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root).expanduser().resolve()
        self.uri = self.root.as_uri()

    def __repr__(self) -> str:
        return f"LocalStore({self.uri!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LocalStore) and other.root == self.root

    def __hash__(self) -> int:
        return hash(("local", self.root))

    # -- paths ------------------------------------------------------------------------------

    def _path(self, key: str, *, allow_empty: bool = False) -> Path:
        clean = clean_key(key, allow_empty=allow_empty)
        return self.root / clean if clean else self.root

    def child(self, prefix: str) -> LocalStore:
        return LocalStore(self._path(prefix, allow_empty=True))

    # -- writes -----------------------------------------------------------------------------

    def _in_parent(self, path: Path, action: Callable[[], object]) -> None:
        """Create `path`'s parent directories, then run `action` (which creates `path`).

        A concurrent delete() prunes empty parent directories, which can remove one between our
        mkdir and `action` (FileNotFoundError), or in the middle of mkdir's own exist_ok check
        (FileExistsError). Both are retried a few times, recreating the parents each time; a
        persistent error (e.g. a file where a directory should be) still surfaces.
        """
        if not self.root.exists():  # a new store: readable by its owner only
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        for attempt in range(_PARENT_RETRIES):
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                action()
                return
            except (FileNotFoundError, FileExistsError):
                if attempt == _PARENT_RETRIES - 1:
                    raise

    def _atomic_write(self, path: Path, fill: Callable[[Path], object]) -> None:
        """Let `fill` write a temp sibling of `path`, then rename it into place."""

        def write() -> None:
            tmp = _tmp_sibling(path)
            try:
                fill(tmp)
                os.replace(tmp, path)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise

        self._in_parent(path, write)

    def put_bytes(self, key: str, data: bytes) -> None:
        def fill(tmp: Path) -> None:
            # O_EXCL: the random name must be ours alone; owner-only, as every object may hold
            # a secret of the job's (its record, its logs).
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
            with os.fdopen(fd, "wb") as f:
                f.write(data)

        self._wrap_os(key, lambda: self._atomic_write(self._path(key), fill))

    def put_file(self, key: str, path: Path, *, progress: Progress | None = None) -> None:
        src = Path(path)
        if not src.is_file():
            raise FileNotFoundError(f"{src} is not a file")
        self._wrap_os(
            key,
            lambda: self._atomic_write(
                self._path(key), lambda t: _copy(src, t, progress, FILE_MODE)
            ),
        )

    def append_bytes(self, key: str, data: bytes) -> None:
        target = self._path(key)

        def append() -> None:
            # O_APPEND: every write lands at the file's current end, so bytes already there are
            # never overwritten, whatever other handles did meanwhile.
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND, FILE_MODE)
            with os.fdopen(fd, "ab") as f:
                f.write(data)

        self._wrap_os(key, lambda: self._in_parent(target, append))

    def matches(self, key: str, path: Path) -> bool:
        """Same size and SHA-256 (a content-addressed object is reused only when it still
        holds what its name says)."""
        stored = self._path(key)
        try:
            if stored.stat().st_size != Path(path).stat().st_size:
                return False
            return file_sha256(stored) == file_sha256(Path(path))
        except OSError:
            return False

    # -- compare and swap --------------------------------------------------------------------

    @contextmanager
    def _locked(self, path: Path) -> Iterator[None]:
        """An exclusive lock on a lock file beside `path` (every conditional writer of the
        key takes it, across processes; flock ends with the process that holds it)."""
        lock = path.with_name(f".{path.name}{_TMP_MARK}lock")  # never listed as an object
        self._in_parent(lock, lambda: lock.touch(mode=FILE_MODE, exist_ok=True))
        with lock.open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield

    def get_versioned(self, key: str) -> tuple[bytes, str]:
        data = self.get_bytes(key)
        return data, hashlib.sha256(data).hexdigest()

    def put_if(self, key: str, data: bytes, *, version: str | None) -> str | None:
        path = self._path(key)
        with self._locked(path):
            try:
                current: str | None = hashlib.sha256(path.read_bytes()).hexdigest()
            except FileNotFoundError:
                current = None
            if current != version:
                return None
            self.put_bytes(key, data)
        return hashlib.sha256(data).hexdigest()

    # -- reads ------------------------------------------------------------------------------

    def get_bytes(self, key: str) -> bytes:
        path = self._path(key)
        return self._read(key, path.read_bytes)

    def get_range(self, key: str, start: int) -> bytes:
        if start < 0:
            raise ValueError(f"get_range start must be >= 0, got {start}")
        path = self._path(key)

        def read() -> bytes:
            with path.open("rb") as f:
                f.seek(start)
                return f.read()

        return self._read(key, read)

    def get_file(self, key: str, path: Path, *, progress: Progress | None = None) -> None:
        src = self._path(key)
        dest = Path(path)
        if not src.is_file():
            raise NotFoundError(f"{self.url(key)} does not exist")
        # Same temp-and-rename dance on the destination, so a reader of `path` (or a crash)
        # never sees a half-copied file.
        try:
            self._atomic_write(dest, lambda t: _copy(src, t, progress, 0o666))
        except FileNotFoundError:
            if not src.is_file():  # deleted between the check and the copy
                raise NotFoundError(f"{self.url(key)} does not exist") from None
            raise

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def info(self, key: str) -> ObjectInfo | None:
        path = self._path(key)
        try:
            st = path.stat()
        except OSError:
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        return ObjectInfo(
            key=path.relative_to(self.root).as_posix(), size=st.st_size, mtime=st.st_mtime
        )

    # -- listing ----------------------------------------------------------------------------

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        # `prefix` names a directory (path-component semantics, same as S3Store): "jobs/a" lists
        # jobs/a/..., never jobs/ab/... — so delete_prefix(job) cannot touch a sibling job.
        base = self._path(prefix, allow_empty=True)
        found: list[ObjectInfo] = []
        for dirpath, _dirnames, filenames in os.walk(base):
            for name in filenames:
                if _is_tmp(name):
                    continue  # an in-progress atomic write
                full = Path(dirpath) / name
                try:
                    st = full.stat()
                except FileNotFoundError:
                    continue  # deleted while we walked
                key = full.relative_to(self.root).as_posix()
                found.append(ObjectInfo(key=key, size=st.st_size, mtime=st.st_mtime))
        # Sort on the full key (not per directory) to match S3's lexicographic order, where
        # "a.txt" sorts before "a/b".
        found.sort(key=lambda info: info.key)
        yield from found

    def list_dirs(self, prefix: str = "") -> list[str]:
        base = self._path(prefix, allow_empty=True)
        try:
            with os.scandir(base) as entries:
                return sorted(e.name for e in entries if e.is_dir())
        except (FileNotFoundError, NotADirectoryError):
            return []

    # -- deletes ----------------------------------------------------------------------------

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            path.unlink()
        except (FileNotFoundError, IsADirectoryError):
            return  # missing is not an error; a directory is not an object
        except OSError as exc:
            raise StoreError(f"{self.url(key)}: delete failed ({exc.strerror})") from None
        self._prune(path.parent)

    def delete_prefix(self, prefix: str) -> None:
        super().delete_prefix(prefix)
        # What is left are put_if's lock files (never listed) and the folders that held
        # them: gone too, so a deleted prefix leaves no directory behind.
        base = self._path(prefix)
        for dirpath, _dirnames, filenames in os.walk(base, topdown=False):
            for name in filenames:
                if name.endswith(f"{_TMP_MARK}lock"):
                    (Path(dirpath) / name).unlink(missing_ok=True)
            try:
                os.rmdir(dirpath)
            except OSError:
                pass  # not empty: something not ours, or written meanwhile
        self._prune(base.parent)

    def _prune(self, directory: Path) -> None:
        # Remove now-empty parents so that list_dirs does not report 'directories' that hold
        # nothing (S3 has no empty prefixes either). rmdir fails harmlessly when not empty.
        while directory != self.root and self.root in directory.parents:
            try:
                directory.rmdir()
            except OSError:
                return
            directory = directory.parent

    # -- error mapping ----------------------------------------------------------------------

    def _read(self, key: str, fn: Callable[[], bytes]) -> bytes:
        try:
            return fn()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise NotFoundError(f"{self.url(key)} does not exist") from None
        except OSError as exc:
            raise StoreError(f"{self.url(key)}: read failed ({exc.strerror or exc})") from None

    def _wrap_os(self, key: str, fn: Callable[[], None]) -> None:
        try:
            fn()
        except OSError as exc:
            raise StoreError(f"{self.url(key)}: write failed ({exc.strerror or exc})") from None


COPY_CHUNK = 8 * 1024 * 1024


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(COPY_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _copy(src: Path, dest: Path, progress: Progress | None, mode: int) -> None:
    """shutil.copyfile (its fast paths), or chunked with `progress` when one is given; the
    copy gets `mode` (less the umask)."""
    os.close(os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode))
    if progress is None:
        shutil.copyfile(src, dest)
        return
    with open(src, "rb") as fin, open(dest, "wb") as fout:
        while chunk := fin.read(COPY_CHUNK):
            fout.write(chunk)
            progress(len(chunk))

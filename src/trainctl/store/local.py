"""A store rooted at a local directory (file:// URIs).

Whole-object writes go to a hidden temp file in the destination directory and are then renamed
over the target with os.replace, which is atomic on POSIX: readers see the old object or the new
one, never a torn write. Temp files are named `.<name>.tmp-<random>` so that `list` can skip them.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from trainctl.errors import NotFoundError, StoreError
from trainctl.spec.uris import clean_key
from trainctl.store import safefs
from trainctl.store.base import ObjectInfo, Progress, Store

T = TypeVar("T")
_TMP_MARK = ".tmp-"
# Objects are readable by their owner only: a job's record and logs may hold its secrets
# (environment values, hyperparameters), and the store is the user's, not the machine's.
FILE_MODE = 0o600
_PARENT_RETRIES = 10


def _is_tmp(name: str) -> bool:
    return name.startswith(".") and _TMP_MARK in name


class LocalStore(Store):
    """Objects are plain files under `root`; 'directories' are real directories.

    Every object below the root is reached through trainctl.store.safefs: no link below the
    root is followed and no special file is opened (a planted link or FIFO reads as no
    object, and a write through one is refused)."""

    def __init__(
        self,
        root: Path,
        *,
        pinned: bool = False,
        _below: tuple[str, ...] = (),
        _root: safefs.Root | None = None,
    ) -> None:
        """`pinned`: every use must find the root the folder it is now (where it exists
        now; else the folder first made there; see safefs.Root): a node's checkpoint and
        output locations, opened when the node checks them and used hours later."""
        # The root as the user named it is trusted (links above it are the machine's); a
        # child store keeps that root and walks its prefix like any key, link-free.
        self._top = Path(root).expanduser().resolve()
        self._root = _root or safefs.Root(self._top, pinned=pinned)
        if pinned and _root is None:
            with contextlib.suppress(OSError):  # (missing or not a folder: its first use says)
                os.close(self._root.open())
        self._below = _below
        self.root = self._top.joinpath(*_below)
        self.uri = self.root.as_uri()

    def __repr__(self) -> str:
        return f"LocalStore({self.uri!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LocalStore) and other.root == self.root

    def __hash__(self) -> int:
        return hash(("local", self.root))

    # -- paths ------------------------------------------------------------------------------

    def _parts(self, key: str, *, allow_empty: bool = False) -> list[str]:
        clean = clean_key(key, allow_empty=allow_empty)
        return [*self._below, *(clean.split("/") if clean else [])]

    def child(self, prefix: str) -> LocalStore:
        parts = tuple(self._parts(prefix, allow_empty=True))
        return LocalStore(self._top, _below=parts, _root=self._root)

    # -- writes -----------------------------------------------------------------------------

    def _in_parent(self, parts: list[str], action: Callable[[int, str], object]) -> None:
        """Open (making them) the folders above the object at `parts`, then run
        `action(folder_fd, name)`, which creates the object `name` in that folder.

        A concurrent delete() prunes empty parent directories, which can remove one between our
        mkdir and `action` (FileNotFoundError). That is retried a few times, recreating the
        parents each time; a persistent error (e.g. a file where a directory should be) still
        surfaces.
        """
        if not self._top.exists():  # a new store: readable by its owner only
            self._top.mkdir(mode=0o700, parents=True, exist_ok=True)
        folders, name = safefs.split(parts)
        for attempt in range(_PARENT_RETRIES):
            try:
                parent = safefs.open_dir(self._root, folders, create=True)
            except FileNotFoundError:
                if attempt == _PARENT_RETRIES - 1:
                    raise
                continue
            try:
                action(parent, name)
                return
            except FileNotFoundError:
                if attempt == _PARENT_RETRIES - 1:
                    raise
            finally:
                os.close(parent)

    def _atomic_write(self, key: str, fill: Callable[[int], object]) -> None:
        """Let `fill` write a new temp sibling of `key` (given its descriptor), then rename
        it into place (a link or FIFO at `key` is replaced, never written through)."""

        def write(parent: int, name: str) -> None:
            tmp = f".{name}{_TMP_MARK}{secrets.token_hex(6)}"
            # O_EXCL: the random name must be ours alone; owner-only, as every object may
            # hold a secret of the job's (its record, its logs).
            fd = safefs.open_in(parent, tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
            try:
                with os.fdopen(fd, "wb") as handle:
                    fill(handle.fileno())
                os.replace(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=parent)
                raise

        self._in_parent(self._parts(key), write)

    def put_bytes(self, key: str, data: bytes) -> None:
        self._wrap_os(key, lambda: self._atomic_write(key, lambda fd: _write_all(fd, data)))

    def put_file(self, key: str, path: Path, *, progress: Progress | None = None) -> None:
        src = Path(path)
        if not src.is_file():
            raise FileNotFoundError(f"{src} is not a file")
        self._wrap_os(
            key, lambda: self._atomic_write(key, lambda fd: _copy_path(src, fd, progress))
        )

    def append_bytes(self, key: str, data: bytes) -> None:
        def append(parent: int, name: str) -> None:
            # O_APPEND: every write lands at the file's current end, so bytes already there are
            # never overwritten, whatever other handles did meanwhile.
            flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
            fd = safefs.open_in(parent, name, flags, FILE_MODE)
            try:
                _write_all(fd, data)
            finally:
                os.close(fd)

        self._wrap_os(key, lambda: self._in_parent(self._parts(key), append))

    def matches(self, key: str, path: Path) -> bool:
        """Same size and SHA-256 (a content-addressed object is reused only when it still
        holds what its name says)."""
        try:
            fd = safefs.open_file(self._root, self._parts(key))
        except (OSError, StoreError):
            return False
        try:
            if os.fstat(fd).st_size != Path(path).stat().st_size:
                return False
            return _fd_sha256(fd) == file_sha256(Path(path))
        except OSError:
            return False
        finally:
            os.close(fd)

    # -- compare and swap --------------------------------------------------------------------

    @contextmanager
    def _locked(self, key: str) -> Iterator[None]:
        """An exclusive lock on a lock file beside `key` (every conditional writer of the
        key takes it, across processes; flock ends with the process that holds it)."""
        folders, name = safefs.split(self._parts(key))
        opened: list[int] = []

        def open_lock(parent: int, lock: str) -> None:
            opened.append(safefs.open_in(parent, lock, os.O_RDWR | os.O_CREAT, FILE_MODE))

        # Named so that it is never listed as an object.
        self._in_parent([*folders, f".{name}{_TMP_MARK}lock"], open_lock)
        try:
            fcntl.flock(opened[0], fcntl.LOCK_EX)
            yield
        finally:
            os.close(opened[0])

    def get_versioned(self, key: str) -> tuple[bytes, str]:
        data = self.get_bytes(key)
        return data, hashlib.sha256(data).hexdigest()

    def put_if(self, key: str, data: bytes, *, version: str | None) -> str | None:
        with self._locked(key):
            try:
                current: str | None = hashlib.sha256(self.get_bytes(key)).hexdigest()
            except NotFoundError:
                current = None
            if current != version:
                return None
            self.put_bytes(key, data)
        return hashlib.sha256(data).hexdigest()

    # -- reads ------------------------------------------------------------------------------

    def get_bytes(self, key: str) -> bytes:
        parts = self._parts(key)
        return self._read(key, lambda: safefs.read_bytes(self._root, parts))

    def get_range(self, key: str, start: int) -> bytes:
        if start < 0:
            raise ValueError(f"get_range start must be >= 0, got {start}")
        parts = self._parts(key)
        return self._read(key, lambda: safefs.read_bytes(self._root, parts, start))

    def get_file(self, key: str, path: Path, *, progress: Progress | None = None) -> None:
        parts = self._parts(key)
        src = self._read(key, lambda: safefs.open_file(self._root, parts))
        dest = Path(path).absolute()
        # Same temp-and-rename dance on the destination, so a reader of `path` (or a crash)
        # never sees a half-copied file. The destination is the caller's own path.
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            _copy_to_new(src, dest, progress)
        except OSError as exc:
            raise StoreError(f"{dest}: write failed ({exc.strerror or exc})") from None
        finally:
            os.close(src)

    def exists(self, key: str) -> bool:
        return safefs.regular(self._root, self._parts(key)) is not None

    def info(self, key: str) -> ObjectInfo | None:
        st = safefs.regular(self._root, self._parts(key))
        if st is None:
            return None
        return ObjectInfo(key=clean_key(key), size=st.st_size, mtime=st.st_mtime)

    # -- listing ----------------------------------------------------------------------------

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        # `prefix` names a directory (path-component semantics, same as S3Store): "jobs/a" lists
        # jobs/a/..., never jobs/ab/... — so delete_prefix(job) cannot touch a sibling job.
        # Sorted on the full key (safefs.walk sorts), matching S3's lexicographic order.
        clean = clean_key(prefix, allow_empty=True)
        lead = f"{clean}/" if clean else ""
        for entry in safefs.walk(self._root, self._parts(prefix, allow_empty=True)):
            name = entry.rel.rsplit("/", 1)[-1]
            if not _is_tmp(name):  # an in-progress atomic write
                yield ObjectInfo(key=lead + entry.rel, size=entry.size, mtime=entry.mtime)

    def list_dirs(self, prefix: str = "") -> list[str]:
        return safefs.subdirs(self._root, self._parts(prefix, allow_empty=True))

    # -- deletes ----------------------------------------------------------------------------

    def delete(self, key: str) -> None:
        folders, name = safefs.split(self._parts(key))
        try:
            parent = safefs.open_dir(self._root, folders)
        except (FileNotFoundError, NotADirectoryError, safefs.RefusedPathError):
            return  # missing is not an error (nor is a key below a link: no object there)
        try:
            os.unlink(name, dir_fd=parent)
        except (FileNotFoundError, IsADirectoryError):
            return  # missing is not an error; a directory is not an object
        except OSError as exc:
            raise StoreError(f"{self.url(key)}: delete failed ({exc.strerror})") from None
        finally:
            os.close(parent)
        self._prune(folders)

    def delete_prefix(self, prefix: str) -> None:
        parts = self._parts(prefix)
        st = safefs.lstat(self._root, parts)
        if st is not None and stat.S_ISLNK(st.st_mode):
            # A link where a prefix should be (an alias of another job's folder) is one
            # entry: it goes, and what it points to stays.
            self._wrap_os(prefix, lambda: safefs.remove_tree(self._root, parts))
            self._prune(parts[:-1])
            return
        super().delete_prefix(prefix)
        # What is left are put_if's lock files (never listed), links and special files (no
        # objects), and the folders that held them: gone too, so a deleted prefix leaves no
        # directory behind.
        self._remove_empty(parts)
        self._prune(parts[:-1])

    def _remove_empty(self, parts: list[str]) -> None:
        try:
            top = safefs.open_dir(self._root, parts)
        except OSError:
            return
        try:  # bottom-up: a folder's own folders are emptied before it is
            for _path, dirs, files, dirfd in os.fwalk(".", dir_fd=top, topdown=False):
                for name in files + dirs:
                    with contextlib.suppress(OSError):  # (gone meanwhile)
                        mode = os.stat(name, dir_fd=dirfd, follow_symlinks=False).st_mode
                        if stat.S_ISDIR(mode):
                            os.rmdir(name, dir_fd=dirfd)  # (not empty: written meanwhile)
                        elif not stat.S_ISREG(mode) or name.endswith(f"{_TMP_MARK}lock"):
                            # A link or special file is no object: it goes as itself.
                            os.unlink(name, dir_fd=dirfd)
        finally:
            os.close(top)
        with contextlib.suppress(OSError):
            self._rmdir(parts)

    def _rmdir(self, parts: list[str]) -> None:
        folders, name = safefs.split(parts)
        parent = safefs.open_dir(self._root, folders)
        try:
            os.rmdir(name, dir_fd=parent)
        finally:
            os.close(parent)

    def _prune(self, folders: list[str]) -> None:
        # Remove now-empty parents so that list_dirs does not report 'directories' that hold
        # nothing (S3 has no empty prefixes either). rmdir fails harmlessly when not empty.
        parts = list(folders)
        while len(parts) > len(self._below):
            try:
                self._rmdir(parts)
            except OSError:
                return
            parts.pop()

    # -- error mapping ----------------------------------------------------------------------

    def _read(self, key: str, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise NotFoundError(f"{self.url(key)} does not exist") from None
        except safefs.RefusedPathError:  # no object, as list() and exists() say too
            raise NotFoundError(
                f"{self.url(key)} is a link or a special file, not a stored object"
            ) from None
        except OSError as exc:
            raise StoreError(f"{self.url(key)}: read failed ({exc.strerror or exc})") from None

    def _wrap_os(self, key: str, fn: Callable[[], None]) -> None:
        try:
            fn()
        except OSError as exc:
            raise StoreError(f"{self.url(key)}: write failed ({exc.strerror or exc})") from None


COPY_CHUNK = safefs.CHUNK


def file_sha256(path: Path) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return _fd_sha256(fd)
    finally:
        os.close(fd)


def _fd_sha256(fd: int) -> str:
    digest = hashlib.sha256()
    offset = 0
    while chunk := os.pread(fd, COPY_CHUNK, offset):
        digest.update(chunk)
        offset += len(chunk)
    return digest.hexdigest()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _copy_fd(src: int, dest: int, progress: Progress | None) -> None:
    """Copy an open regular file's bytes (as large as it is now) into `dest`."""
    size, offset = os.fstat(src).st_size, 0
    while offset < size:
        chunk = os.pread(src, min(COPY_CHUNK, size - offset), offset)
        if not chunk:
            break
        _write_all(dest, chunk)
        offset += len(chunk)
        if progress is not None:
            progress(len(chunk))


def _copy_path(src: Path, dest: int, progress: Progress | None) -> None:
    """Copy the caller's own file `src` (a link the caller gave is theirs to follow; a FIFO
    or device is refused rather than read forever) into `dest`."""
    fd = safefs.open_own(src)
    try:
        _copy_fd(fd, dest, progress)
    finally:
        os.close(fd)


def _copy_to_new(src: int, dest: Path, progress: Progress | None) -> None:
    """Copy into a new temp sibling of `dest`, then rename it over `dest`."""
    tmp = dest.with_name(f".{dest.name}{_TMP_MARK}{secrets.token_hex(6)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    try:
        with os.fdopen(fd, "wb") as handle:
            _copy_fd(src, handle.fileno(), progress)
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise

"""One way to open anything below a trusted directory: no link followed, no special file
opened, every read bounded.

A store's root, a job's output or checkpoint location and a node's working directory may sit
on a filesystem other users write to (a shared `/scratch`). Checking a path's text and then
opening it follows whatever the path is at that moment: a link planted in a job's `logs/` or
`output/`, or swapped in for a folder after a check, sends the read, the write or the delete
somewhere else (another job's record, the lease, `/usr`), and a FIFO or `/dev/zero` where a
record should be hangs the reader or never ends. So every component below the root is opened
relative to its parent's descriptor with `O_NOFOLLOW` (a link there is refused, not
followed, and cannot be swapped in between a check and the open), a file is opened with
`O_NONBLOCK` and accepted only when `fstat` says it is a regular file, and a read stops at
the size `fstat` gave.

The root itself is trusted as the user named it (links above it, such as `/home ->
/data/home`, are the machine's, not an attacker's).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
CHUNK = 8 * 1024 * 1024


class RefusedPathError(OSError):
    """A link or a special file where a directory or a regular file was expected."""


@dataclass(frozen=True)
class Entry:
    """A regular file found by walk(): its path relative to the walked folder."""

    rel: str
    size: int
    mtime: float


def _refused(path: str, what: str) -> RefusedPathError:
    return RefusedPathError(
        errno.ELOOP, f"{what}: trainctl opens no link or special file here", path
    )


def parts_of(rel: str | Sequence[str]) -> list[str]:
    """The components of a relative path, '.' and empty ones dropped; '..' refused."""
    parts = [p for p in (rel.split("/") if isinstance(rel, str) else rel) if p not in ("", ".")]
    if ".." in parts:
        raise _refused("/".join(parts), "'..' in a path below a trusted folder")
    return parts


class Root:
    """A trusted folder. Its path was resolved when it was named; opened, it may not have
    become a link since, and a pinned root must still be the folder it was when first
    opened (a node's checkpoint location: a folder swapped for another, or for a link to
    another job's, between two sync passes is refused, not written through)."""

    def __init__(self, path: Path, *, pinned: bool = False) -> None:
        self.path = Path(path)
        self.pinned = pinned
        self._identity: tuple[int, int] | None = None

    def __str__(self) -> str:
        return str(self.path)

    def open(self) -> int:
        fd = os.open(self.path, _DIR_FLAGS)
        if not self.pinned:
            return fd
        st = os.fstat(fd)
        if self._identity is None:
            self._identity = (st.st_dev, st.st_ino)
        elif self._identity != (st.st_dev, st.st_ino):
            os.close(fd)
            raise _refused(str(self.path), "no longer the folder it was when first opened")
        return fd


RootLike = Root | Path


def _root(root: RootLike) -> Root:
    return root if isinstance(root, Root) else Root(root)


def open_dir(root: RootLike, rel: str | Sequence[str] = (), *, create: bool = False) -> int:
    """A descriptor of the folder `rel` below `root`, each component opened without
    following a link (`create`: missing ones are made). The caller closes it."""
    parts = parts_of(rel)
    top = _root(root)
    try:
        fd = top.open()
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR) and top.path.is_symlink():
            raise _refused(str(top.path), "a link") from None
        raise
    for part in parts:
        fd = _step(fd, part, create, top)  # (closes the folder it steps from)
    return fd


def make_dirs(root: RootLike, rel: str | Sequence[str]) -> int:
    """A descriptor of the folder `rel` below `root`, made where missing, in a place the
    caller owns and fills (a restore puts back what was stored): a link or a file where a
    folder belongs is removed, never followed, and a folder made there instead."""
    fd = open_dir(root, ())
    try:
        for part in parts_of(rel):
            try:
                child = _step(os.dup(fd), part, True, _root(root))
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                os.unlink(part, dir_fd=fd)  # (a folder is never in the way: ENOTDIR/ELOOP)
                child = _step(os.dup(fd), part, True, _root(root))
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _step(parent: int, name: str, create: bool, root: Root) -> int:
    """Open `name` in the folder `parent` (closed here either way)."""
    try:
        for _ in range(3):  # a folder made meanwhile by another writer, or pruned by one
            try:
                return os.open(name, _DIR_FLAGS, dir_fd=parent)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, dir_fd=parent)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    _refuse_unless_missing(parent, name, root)
                raise
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    finally:
        os.close(parent)


def _refuse_unless_missing(parent: int, name: str, root: Root) -> None:
    try:
        mode = os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISLNK(mode):
        raise _refused(f"{root}/…/{name}", "a link") from None


def split(rel: str | Sequence[str]) -> tuple[list[str], str]:
    parts = parts_of(rel)
    if not parts:
        raise IsADirectoryError(errno.EISDIR, "a folder, not a file", "/".join(parts))
    return parts[:-1], parts[-1]


def open_file(
    root: RootLike, rel: str | Sequence[str], flags: int = os.O_RDONLY, mode: int = 0o600
) -> int:
    """A descriptor of the regular file `rel` below `root` (with os.open's `flags` and
    `mode`): refused when it, or a folder on the way, is a link or a special file."""
    folders, name = split(rel)
    parent = open_dir(root, folders, create=bool(flags & os.O_CREAT))
    try:
        return open_in(parent, name, flags, mode, shown=f"{root}/{'/'.join(parts_of(rel))}")
    finally:
        os.close(parent)


def open_in(parent: int, name: str, flags: int, mode: int = 0o600, *, shown: str = "") -> int:
    """Open the regular file `name` in the folder `parent` (a descriptor)."""
    try:
        fd = os.open(name, flags | _FILE_FLAGS, mode, dir_fd=parent)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refused(shown or name, "a link") from None
        if exc.errno == errno.ENXIO:  # a FIFO opened for writing with no reader
            raise _refused(shown or name, "a special file") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, "a folder, not a file", shown or name)
        raise _refused(shown or name, "a special file")
    os.set_blocking(fd, True)
    return fd


def open_own(path: Path) -> int:
    """A descriptor of the caller's own file `path` (a link the caller named is theirs to
    follow), refused unless it is a regular file: a FIFO or a device would be read forever."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise RefusedPathError(errno.EINVAL, "not a regular file", str(path))
    return fd


def read_fd(fd: int, start: int = 0, limit: int | None = None) -> bytes:
    """The bytes of an open regular file from `start`, as large as `fstat` says it is now
    (a file that grows meanwhile, such as a live log, is read up to that size), at most
    `limit` of them."""
    size = os.fstat(fd).st_size
    want = max(0, size - start)
    if limit is not None:
        want = min(want, limit)
    chunks: list[bytes] = []
    offset = start
    while want > 0:
        chunk = os.pread(fd, min(want, CHUNK), offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
        want -= len(chunk)
    return b"".join(chunks)


def read_bytes(root: RootLike, rel: str | Sequence[str], start: int = 0) -> bytes:
    fd = open_file(root, rel)
    try:
        return read_fd(fd, start)
    finally:
        os.close(fd)


def lstat(root: RootLike, rel: str | Sequence[str]) -> os.stat_result | None:
    """The entry `rel` below `root` as it is (a link is a link), None where there is none or
    a folder on the way is a link."""
    try:
        folders, name = split(rel)
        parent = open_dir(root, folders)
    except (OSError, ValueError):
        return None
    try:
        return os.stat(name, dir_fd=parent, follow_symlinks=False)
    except OSError:
        return None
    finally:
        os.close(parent)


def regular(root: RootLike, rel: str | Sequence[str]) -> os.stat_result | None:
    """lstat() where the entry is a regular file, else None."""
    st = lstat(root, rel)
    return st if st is not None and stat.S_ISREG(st.st_mode) else None


def walk(root: RootLike, rel: str | Sequence[str] = ()) -> list[Entry]:
    """Every regular file below the folder `rel` (paths relative to it), sorted; links and
    special files are passed over and no link is followed, the folder `rel` itself included.
    A missing folder, or one that is a link, holds nothing."""
    try:
        top = open_dir(root, rel)
    except (OSError, ValueError):
        return []
    found: list[Entry] = []
    try:
        for dirpath, _dirs, files, dirfd in os.fwalk(".", dir_fd=top):
            prefix = "" if dirpath == "." else dirpath[2:] + "/"
            for name in files:
                try:
                    st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
                except FileNotFoundError:
                    continue  # deleted while we walked
                if stat.S_ISREG(st.st_mode):
                    found.append(Entry(prefix + name, st.st_size, st.st_mtime))
    finally:
        os.close(top)
    found.sort(key=lambda e: e.rel)
    return found


def subdirs(root: RootLike, rel: str | Sequence[str] = ()) -> list[str]:
    """The real folders (not links to folders) directly in the folder `rel`."""
    try:
        top = open_dir(root, rel)
    except (OSError, ValueError):
        return []
    try:
        with os.scandir(top) as entries:
            return sorted(e.name for e in entries if e.is_dir(follow_symlinks=False))
    finally:
        os.close(top)


def remove_tree(root: RootLike, rel: str | Sequence[str]) -> None:
    """Delete the folder `rel` below `root` and everything in it, following no link: a link
    (at `rel` itself or inside) is removed as a link, its target untouched."""
    folders, name = split(rel)
    try:
        parent = open_dir(root, folders)
    except FileNotFoundError:
        return
    try:
        _remove_entry(parent, name)
    finally:
        os.close(parent)


def _remove_entry(parent: int, name: str) -> None:
    try:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=parent)
        return
    fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
    try:
        for child in os.listdir(fd):
            _remove_entry(fd, child)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent)

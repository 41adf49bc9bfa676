"""Packaging the user's source directory into a reproducible .tar.gz (unpacked on a node by
`trainctl.node.extract`).

The archive's sha256 doubles as a content address (an unchanged tree is not uploaded again),
so the bytes must depend only on file paths, contents and executable bits: never on mtimes,
owners, umask or directory listing order. Extraction happens on training nodes from an
object store, so it refuses anything that could write outside the destination.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import stat
import tarfile
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO

import pathspec

from trainctl.errors import PackagingError, SpecError

__all__ = [
    "IGNORE_FILES",
    "PackagedSource",
    "list_included_files",
    "package_source",
]

# Never useful on a training node and often huge (a stray venv or node_modules can be GBs).
EXCLUDED_DIR_NAMES = frozenset(
    {
        ".git",
        "__pycache__",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        ".ipynb_checkpoints",
        "node_modules",
        ".hg",
        ".svn",
        ".tox",
        ".nox",
    }
)
# A virtualenv or conda env can have any name, so it is recognised by its marker instead.
ENV_MARKERS = ("pyvenv.cfg", "conda-meta")
EXCLUDED_FILE_SUFFIXES = (".pyc", ".pyo")
EXCLUDED_FILE_NAMES = frozenset({".DS_Store"})

# Read in this order in every directory; a later file (and a deeper directory) overrides an
# earlier one, as nested .gitignore files do in git.
IGNORE_FILES = (".gitignore", ".trainctlignore")

_MIB = 1024 * 1024
_DIR_MODE = 0o755
_EXEC_MODE = 0o755
_FILE_MODE = 0o644


@dataclass(frozen=True)
class PackagedSource:
    path: Path  # the written .tar.gz
    sha256: str  # hex digest of the archive bytes
    size: int  # archive bytes
    file_count: int
    source_bytes: int  # total uncompressed size of the packaged files


@dataclass(frozen=True)
class _Rules:
    """The ignore spec read from one directory; `base` is its path relative to the root."""

    base: str
    spec: pathspec.PathSpec


@dataclass(frozen=True)
class _Entry:
    rel: str  # posix path relative to source_dir
    abs_path: str
    size: int


def list_included_files(source_dir: Path) -> list[str]:
    """The relative posix paths of the files `package_source` would archive, sorted."""
    return [e.rel for e in _collect(Path(source_dir))]


def package_source(source_dir: Path, dest: Path, *, max_bytes: int) -> PackagedSource:
    """Write a reproducible .tar.gz of `source_dir` to `dest`.

    `dest` is the archive path; if it is an existing directory the archive is written into
    it as `source.tar.gz`. The archive replaces `dest` atomically, so a failure never leaves
    a partial archive behind.
    """
    source_dir = Path(source_dir)
    dest = Path(dest)
    if dest.is_dir():
        dest = dest / "source.tar.gz"

    entries = _collect(source_dir)
    # An earlier archive written inside the tree would otherwise be packaged into the next
    # one, making the hash change on every run.
    dest_real = os.path.realpath(dest)
    entries = [e for e in entries if os.path.realpath(e.abs_path) != dest_real]

    total = sum(e.size for e in entries)
    if total > max_bytes:
        raise SpecError(
            "source_dir",
            f"{source_dir} holds {total / _MIB:.1f} MiB of files, over the "
            f"{max_bytes / _MIB:.1f} MiB limit (TRAINCTL_MAX_SOURCE_MB); move data out of it "
            "or exclude it with .trainctlignore",
        )

    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as raw:
            source_bytes = _write_archive(raw, entries)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; the archive is not a secret
        digest = hashlib.sha256()
        with open(tmp, "rb") as f:
            for chunk in iter(lambda: f.read(_MIB), b""):
                digest.update(chunk)
        size = tmp.stat().st_size
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return PackagedSource(
        path=dest,
        sha256=digest.hexdigest(),
        size=size,
        file_count=len(entries),
        source_bytes=source_bytes,
    )


def _write_archive(raw: BinaryIO, entries: Sequence[_Entry]) -> int:
    # Directories are derived from the files (as in git, empty directories are not kept), so
    # the archive is a pure function of the file list.
    dirs: set[str] = set()
    for e in entries:
        parent = PurePosixPath(e.rel).parent
        while str(parent) != ".":
            dirs.add(str(parent))
            parent = parent.parent
    by_rel = {e.rel: e for e in entries}
    source_bytes = 0
    # filename="" and mtime=0 keep the gzip header free of the temp file's name and the clock.
    with (
        gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for rel in sorted(dirs | by_rel.keys()):
            if rel in dirs:
                tar.addfile(_tarinfo(rel, tarfile.DIRTYPE, _DIR_MODE, 0))
                continue
            entry = by_rel[rel]
            try:
                # open() follows a symlink, which _collect has already checked stays inside.
                with open(entry.abs_path, "rb") as f:
                    st = os.fstat(f.fileno())
                    mode = _EXEC_MODE if st.st_mode & 0o111 else _FILE_MODE
                    # fstat, not the size seen while collecting, so a file rewritten in
                    # between is archived consistently rather than truncated or padded.
                    tar.addfile(_tarinfo(rel, tarfile.REGTYPE, mode, st.st_size), f)
                    source_bytes += st.st_size
            except OSError as exc:
                raise PackagingError(f"cannot read {entry.abs_path}: {_reason(exc)}") from exc
    return source_bytes


def _tarinfo(name: str, kind: bytes, mode: int, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.size = size
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _collect(source_dir: Path) -> list[_Entry]:
    if not source_dir.is_dir():
        raise SpecError("source_dir", f"{source_dir} is not a directory")
    root_real = os.path.realpath(source_dir)
    out: list[_Entry] = []
    _walk(source_dir, "", root_real, [], out)
    out.sort(key=lambda e: e.rel)
    # Readability is checked up front so an unreadable file fails before anything is
    # written, not halfway through the archive.
    for e in out:
        if not os.access(e.abs_path, os.R_OK):
            raise PackagingError(f"cannot read {e.abs_path}: permission denied")
    return out


def _walk(
    directory: Path, rel_dir: str, root_real: str, rules: list[_Rules], out: list[_Entry]
) -> None:
    rules = rules + _read_rules(directory, rel_dir)
    try:
        with os.scandir(directory) as it:
            children = sorted(it, key=lambda d: d.name)
    except OSError as exc:
        raise PackagingError(f"cannot list {directory}: {_reason(exc)}") from exc

    for child in children:
        rel = f"{rel_dir}/{child.name}" if rel_dir else child.name
        try:
            if child.is_symlink():
                _add_symlink(child, rel, root_real, rules, out)
            elif child.is_dir(follow_symlinks=False):
                if _dir_excluded(child, rel, rules):
                    continue
                _walk(Path(child.path), rel, root_real, rules, out)
            elif child.is_file(follow_symlinks=False):
                if _file_excluded(child.name, rel, rules):
                    continue
                out.append(_Entry(rel, child.path, child.stat(follow_symlinks=False).st_size))
            # Sockets, fifos and device nodes are skipped: they have no content to ship and
            # opening a fifo would block.
        except OSError as exc:
            raise PackagingError(f"cannot read {child.path}: {_reason(exc)}") from exc


def _add_symlink(
    child: os.DirEntry[str], rel: str, root_real: str, rules: list[_Rules], out: list[_Entry]
) -> None:
    try:
        target = os.path.realpath(child.path, strict=True)
    except FileNotFoundError:
        target = None
    except (OSError, RuntimeError) as exc:  # symlink loops: RuntimeError before 3.13
        raise PackagingError(f"cannot resolve symlink {child.path}: {exc}") from exc

    # Symlinked directories are not followed: following them could loop or pull in a
    # whole other tree, and the link itself cannot be archived because extraction refuses
    # links. Skipping them silently matches how they are usually used (data, caches).
    if target is not None and os.path.isdir(target):
        return
    # Checked before the target so a user can silence a bad link by ignoring it.
    if _file_excluded(child.name, rel, rules):
        return
    if target is None:
        raise PackagingError(f"symlink {child.path} is broken (its target does not exist)")
    if os.path.commonpath([root_real, target]) != root_real:
        raise PackagingError(
            f"symlink {child.path} points outside the source directory (to {target}); "
            "copy the file in, or exclude the link with .trainctlignore"
        )
    st = os.stat(target)
    if stat.S_ISREG(st.st_mode):
        out.append(_Entry(rel, child.path, st.st_size))


def _read_rules(directory: Path, rel_dir: str) -> list[_Rules]:
    found: list[_Rules] = []
    for name in IGNORE_FILES:
        path = directory / name
        if not path.is_file():
            continue
        try:
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError as exc:
            raise PackagingError(f"cannot read {path}: {_reason(exc)}") from exc
        found.append(_Rules(rel_dir, pathspec.GitIgnoreSpec.from_lines(lines)))
    return found


def _dir_excluded(child: os.DirEntry[str], rel: str, rules: Sequence[_Rules]) -> bool:
    if child.name in EXCLUDED_DIR_NAMES:
        return True
    if any(os.path.lexists(os.path.join(child.path, m)) for m in ENV_MARKERS):
        return True
    # The trailing slash lets directory-only patterns ("build/") match.
    return _ignored(rel + "/", rules)


def _file_excluded(name: str, rel: str, rules: Sequence[_Rules]) -> bool:
    if name in EXCLUDED_FILE_NAMES or name.endswith(EXCLUDED_FILE_SUFFIXES):
        return True
    return _ignored(rel, rules)


def _ignored(rel: str, rules: Iterable[_Rules]) -> bool:
    """Gitignore precedence: the last matching pattern wins, deeper files override shallower."""
    decision = False
    for r in rules:
        sub = rel[len(r.base) + 1 :] if r.base else rel
        verdict = _last_match(r.spec, sub)
        if verdict is not None:
            decision = verdict
    return decision


def _last_match(spec: pathspec.PathSpec, path: str) -> bool | None:
    """True if excluded, False if re-included by a '!' pattern, None if no pattern matches."""
    check = getattr(spec, "check_file", None)
    if check is not None:
        include: bool | None = check(path).include
        return include
    # pathspec releases without check_file(): the last matching pattern decides.
    verdict: bool | None = None
    for pattern in spec.patterns:
        if pattern.include is not None and pattern.match_file(path) is not None:
            verdict = pattern.include
    return verdict


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)

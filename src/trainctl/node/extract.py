"""Unpacking the job's source archive on a node, safely: no member may land outside the
code directory (absolute paths, `..`, links that lead out, devices are refused)."""

from __future__ import annotations

import os
import tarfile
from collections.abc import Sequence
from pathlib import Path, PureWindowsPath

from trainctl.errors import PackagingError

# tarfile.FilterError only exists where extraction filters do; () matches nothing.
_FILTER_ERROR: type[BaseException] | tuple[()] = getattr(tarfile, "FilterError", ())


def safe_extract(archive: Path, dest: Path) -> list[str]:
    """Extract a .tar.gz into `dest`, refusing members that could land outside it.

    Every member is checked before anything is written, so a refused archive leaves `dest`
    untouched. The stdlib "data" filter, where this Python has it, then re-checks each
    member at write time against what is really on disk.
    """
    archive = Path(archive)
    dest = Path(dest)
    try:
        with tarfile.open(archive, mode="r:gz") as tar:
            members = tar.getmembers()
            _check_members(members)
            dest.mkdir(parents=True, exist_ok=True)
            if hasattr(tarfile, "data_filter"):
                tar.extractall(dest, members=members, filter="data")
            else:  # pragma: no cover - Python < 3.10.12 / 3.11.4; _check_members is the guard
                tar.extractall(dest, members=members)
    except PackagingError:
        raise
    except _FILTER_ERROR as exc:
        raise PackagingError(f"refusing archive {archive}: {exc}") from exc
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise PackagingError(f"cannot extract {archive}: {exc}") from exc
    return [m.name for m in members]


def _check_members(members: Sequence[tarfile.TarInfo]) -> None:
    # All link names up front, so the checks do not depend on member order.
    links = {_normalise(m.name) for m in members if m.issym() or m.islnk()}
    for m in members:
        reason = _member_problem(m, links)
        if reason:
            raise PackagingError(f"refusing archive member {m.name!r}: {reason}")


def _member_problem(m: tarfile.TarInfo, links: set[str]) -> str | None:
    name = m.name
    if not name or _is_absolute(name):
        return "absolute path"
    if ".." in name.replace("\\", "/").split("/"):
        return "'..' in path"
    if not (m.isreg() or m.isdir() or m.issym() or m.islnk()):
        if m.ischr() or m.isblk():
            return "device file"
        if m.isfifo():
            return "fifo"
        return "unsupported member type"
    # Lexical checks cannot see through links: with 'a' -> '.', a member 'a/b' -> '..' looks
    # contained but lands in dest's parent. Our own archives hold no links at all, so
    # anything that goes through one is refused rather than reasoned about.
    norm = _normalise(name)
    through = _through_link(norm.split("/"), links)
    if through:
        return f"path goes through the link {through!r}"
    if m.issym() or m.islnk():
        kind = "symlink" if m.issym() else "hard link"
        if not m.linkname or _is_absolute(m.linkname):
            return f"{kind} to absolute path {m.linkname!r}"
        # Symlink targets are relative to the link's directory, hard link targets to the
        # archive root.
        base = norm.split("/")[:-1] if m.issym() else []
        parts = base + m.linkname.replace("\\", "/").split("/")
        stack: list[str] = []
        for i, part in enumerate(parts):
            if part in ("", "."):
                continue
            if part == "..":
                if not stack:
                    return f"{kind} to {m.linkname!r} escapes the destination"
                stack.pop()
                continue
            stack.append(part)
            if i < len(parts) - 1 and "/".join(stack) in links:
                return f"{kind} to {m.linkname!r} goes through the link {'/'.join(stack)!r}"
    return None


def _through_link(parts: list[str], links: set[str]) -> str | None:
    """The first proper prefix of `parts` that is a link member, if any."""
    for i in range(1, len(parts)):
        prefix = "/".join(parts[:i])
        if prefix in links:
            return prefix
    return None


def _normalise(name: str) -> str:
    return os.path.normpath(name.replace("\\", "/")).replace(os.sep, "/")


def _is_absolute(name: str) -> bool:
    # Windows drive and UNC forms too: an archive built elsewhere may be extracted there.
    return name.startswith(("/", "\\")) or bool(PureWindowsPath(name).drive)

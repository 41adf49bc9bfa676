"""Staging a node before its workers start: input channels (copied, linked or downloaded),
the config files of the /opt/ml layout, and packing what the workers leave (model, output)."""

from __future__ import annotations

import json
import os
import shutil
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainctl.node.sync import size_text


def write_json(path: Path, data: Any) -> None:
    """Owner-only: the configuration files hold the job's hyperparameters, secrets too."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)  # (a file of another mode, or a link, is replaced)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(data, indent=2))


def in_shard(index: int, shard: tuple[int, int] | None) -> bool:
    """Whether the `index`-th object (in key order) of a channel is this node's: with
    `shard` = (rank, nodes), ShardedByS3Key gives each node every nodes-th object."""
    return shard is None or index % shard[1] == shard[0]


def stage_channel(
    name: str,
    uri: str,
    dest: Path,
    log,
    *,
    shard: tuple[int, int] | None = None,
    link: bool = False,
    store_uri: str | None = None,
) -> Path | None:
    """Put channel `name` at `dest`: all of it, or with `shard` (rank, nodes) this node's
    share of its objects (SageMaker's ShardedByS3Key). A file:// channel is copied (File
    mode: the script's writes never reach the original), or with `link` linked (FastFile),
    except inside the store at `store_uri`: another job's results are read, never linked
    (a script writing through the link would rewrite them). Returns the original a link
    leads to (the node's view makes it read-only: trainctl.node.sandbox), else None."""
    from trainctl.spec.confine import overlaps
    from trainctl.spec.uris import parse_uri
    from trainctl.store import open_store

    scheme, rest = parse_uri(uri, field=f"inputs.{name}")
    if link and scheme == "file" and store_uri and overlaps(uri, store_uri):
        link = False
        log(
            f"channel {name}: {uri} is in the store: copied, not linked (FastFile would let "
            "the script write to another job's results)"
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    what = "" if shard is None else f" (shard {shard[0] + 1} of {shard[1]})"
    if scheme == "file":
        src = Path(rest)
        if not src.exists():
            raise FileNotFoundError(f"input channel {name!r}: {uri} does not exist")
        if link:
            _link_channel(src, dest, shard)
            log(f"channel {name}: linked {src}{what} (FastFile: read in place, read-only)")
            return src
        started = time.monotonic()
        count, size, how = _copy_channel(src, dest, shard)
        log(
            f"channel {name}: copied {count} file(s), {size_text(size)} from {src}{what} "
            f"in {time.monotonic() - started:.1f} s ({how}; FastFile links it instead)"
        )
        return None
    store = open_store(uri, field=f"inputs.{name}")
    dest.mkdir(exist_ok=True)
    count = 0
    for index, info in enumerate(store.list("")):  # sorted by key
        if not in_shard(index, shard):
            continue
        store.get_file(info.key, dest / info.key)
        count += 1
    if count == 0 and shard is not None and shard[0] > 0:
        log(f"channel {name}: no object of {uri} falls to this node{what}")
        return None
    if count == 0:  # the URI may name a single object rather than a prefix
        parent_uri, _, leaf = uri.rstrip("/").rpartition("/")
        open_store(parent_uri).get_file(leaf, dest / leaf)
        count = 1
    log(f"channel {name}: downloaded {count} file(s) from {uri}{what}")
    return None


def channel_files(src: Path, shard: tuple[int, int] | None = None) -> list[tuple[Path, Path]]:
    """(source file, path relative to the channel) of a file:// channel, this node's share
    with `shard`: the files in key order, as an s3:// prefix lists them."""
    if src.is_file():
        return [(src, Path(src.name))] if in_shard(0, shard) else []
    files = sorted(p for p in src.rglob("*") if p.is_file())
    return [(p, p.relative_to(src)) for i, p in enumerate(files) if in_shard(i, shard)]


def _link_channel(src: Path, dest: Path, shard: tuple[int, int] | None) -> None:
    if src.is_dir() and shard is None:
        dest.symlink_to(src, target_is_directory=True)
        return
    dest.mkdir(exist_ok=True)
    for path, rel in channel_files(src, shard):
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).symlink_to(path)


# ioctl FICLONE: the destination shares the source's blocks, copied on a write (btrfs, XFS,
# bcachefs...): a copy that costs no time and no space until either side changes.
FICLONE = 0x40049409


def _copy_channel(src: Path, dest: Path, shard: tuple[int, int] | None) -> tuple[int, int, str]:
    """Copy the channel's files; (files, bytes, how): by reflink where the file system
    clones files, else by a kernel copy (sendfile)."""
    dest.mkdir(exist_ok=True)
    reflinks = copies = size = 0
    can_clone = True
    for path, rel in channel_files(src, shard):
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if can_clone and _clone(path, target):
            reflinks += 1
        else:
            can_clone = False  # one refusal says the file system cannot: don't ask again
            shutil.copyfile(path, target)
            copies += 1
        shutil.copystat(path, target)
        size += target.stat().st_size
    how = "copy-on-write reflinks" if reflinks and not copies else "copies"
    if reflinks and copies:
        how = f"{reflinks} reflinks, {copies} copies"
    return reflinks + copies, size, how


def _clone(src: Path, dest: Path) -> bool:
    import fcntl

    try:
        with open(src, "rb") as fin, open(dest, "wb") as fout:
            fcntl.ioctl(fout.fileno(), FICLONE, fin.fileno())
        return True
    except OSError:
        return False


def pack_directory(src: Path, dest: Path, log: Callable[[str], None] | None = None) -> bool:
    """tar.gz of the regular files under src (names relative to it); False if none.

    A link is packed as the file it leads to where that is a regular file inside src;
    any other link (`-> /`, `-> ../../etc/passwd`, to a folder) and any special file is
    left out and named through `log`: a link member reaches outside wherever the tarball
    is unpacked, and a FIFO would be packed as one."""
    root = src.resolve()
    members: list[tuple[Path, str]] = []
    left: list[str] = []
    for dirpath, dirs, files in os.walk(src):  # (links to folders are not walked)
        for name in sorted(files + [d for d in dirs if os.path.islink(os.path.join(dirpath, d))]):
            path = Path(dirpath, name)
            rel = path.relative_to(src).as_posix()
            real = path.resolve() if path.is_symlink() else path
            if real.is_file() and (real is path or real.is_relative_to(root)):
                members.append((real, rel))
            else:
                left.append(rel)
    if left and log is not None:
        shown = ", ".join(left[:5]) + (f" and {len(left) - 5} more" if len(left) > 5 else "")
        log(
            f"{src.name}: left out of {dest.name} (a link out of the folder, or not a "
            f"file): {shown}"
        )
    if not members:
        return False
    with tarfile.open(dest, "w:gz") as tar:
        for real, rel in sorted(members, key=lambda m: m[1]):
            tar.add(real, arcname=rel, recursive=False)
    return True

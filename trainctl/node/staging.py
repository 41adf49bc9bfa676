"""Staging a node before its workers start: input channels (linked or downloaded), the
config files of the /opt/ml layout, and packing what the workers leave (model, output)."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Any


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2))


def in_shard(index: int, shard: tuple[int, int] | None) -> bool:
    """Whether the `index`-th object (in key order) of a channel is this node's: with
    `shard` = (rank, nodes), ShardedByS3Key gives each node every nodes-th object."""
    return shard is None or index % shard[1] == shard[0]


def stage_channel(
    name: str, uri: str, dest: Path, log, *, shard: tuple[int, int] | None = None
) -> None:
    """Put channel `name` at `dest`: all of it, or with `shard` (rank, nodes) this node's
    share of its objects (SageMaker's ShardedByS3Key)."""
    from trainctl.spec.uris import parse_uri
    from trainctl.store import open_store

    scheme, rest = parse_uri(uri, field=f"inputs.{name}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    what = "" if shard is None else f" (shard {shard[0] + 1} of {shard[1]})"
    if scheme == "file":
        src = Path(rest)
        if not src.exists():
            raise FileNotFoundError(f"input channel {name!r}: {uri} does not exist")
        if src.is_dir() and shard is None:
            dest.symlink_to(src, target_is_directory=True)
        elif src.is_dir():
            files = sorted(p for p in src.rglob("*") if p.is_file())
            for index, path in enumerate(files):
                if in_shard(index, shard):
                    link = dest / path.relative_to(src)
                    link.parent.mkdir(parents=True, exist_ok=True)
                    link.symlink_to(path)
            dest.mkdir(exist_ok=True)
        else:
            dest.mkdir(exist_ok=True)
            if in_shard(0, shard):
                (dest / src.name).symlink_to(src)
        log(f"channel {name}: linked {src}{what}")
        return
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
        return
    if count == 0:  # the URI may name a single object rather than a prefix
        parent_uri, _, leaf = uri.rstrip("/").rpartition("/")
        open_store(parent_uri).get_file(leaf, dest / leaf)
        count = 1
    log(f"channel {name}: downloaded {count} file(s) from {uri}{what}")


def pack_directory(src: Path, dest: Path) -> bool:
    """tar.gz of everything under src (names relative to it); False if src is empty."""
    files = sorted(p for p in src.rglob("*") if p.is_file() or p.is_symlink())
    if not files:
        return False
    with tarfile.open(dest, "w:gz") as tar:
        for path in files:
            tar.add(path, arcname=str(path.relative_to(src)), recursive=False)
    return True

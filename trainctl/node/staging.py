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


def stage_channel(name: str, uri: str, dest: Path, log) -> None:
    from trainctl.spec.uris import parse_uri
    from trainctl.store import open_store

    scheme, rest = parse_uri(uri, field=f"inputs.{name}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    if scheme == "file":
        src = Path(rest)
        if not src.exists():
            raise FileNotFoundError(f"input channel {name!r}: {uri} does not exist")
        if src.is_dir():
            dest.symlink_to(src, target_is_directory=True)
        else:
            dest.mkdir(exist_ok=True)
            (dest / src.name).symlink_to(src)
        log(f"channel {name}: linked {src}")
        return
    store = open_store(uri, field=f"inputs.{name}")
    dest.mkdir(exist_ok=True)
    count = 0
    for info in store.list(""):
        store.get_file(info.key, dest / info.key)
        count += 1
    if count == 0:  # the URI may name a single object rather than a prefix
        parent_uri, _, leaf = uri.rstrip("/").rpartition("/")
        open_store(parent_uri).get_file(leaf, dest / leaf)
        count = 1
    log(f"channel {name}: downloaded {count} file(s) from {uri}")


def pack_directory(src: Path, dest: Path) -> bool:
    """tar.gz of everything under src (names relative to it); False if src is empty."""
    files = sorted(p for p in src.rglob("*") if p.is_file() or p.is_symlink())
    if not files:
        return False
    with tarfile.open(dest, "w:gz") as tar:
        for path in files:
            tar.add(path, arcname=str(path.relative_to(src)), recursive=False)
    return True

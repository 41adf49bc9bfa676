"""Checkpoint sync between a node's checkpoint dir and the job's checkpoint URI.

Nodes do not share a disk: each uploads what appears in its own dir, and before an attempt
every node downloads the union of what all nodes uploaded. What is "in the store" is what
the nodes' manifests list (`.trainctl/node-<rank>.json`); a file is listed only after its
upload finished, and a manifest is replaced only after the files it adds are up, so a
partly uploaded checkpoint is never seen by a restore, and a file cut short while it was
written in place (node.sync.unfinished) never replaces its last whole copy. The training
helper library then picks the newest checkpoint that is complete across ranks (see
trainctl.train).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from trainctl.errors import NotFoundError
from trainctl.node.sync import PeriodicSync, Signature, download_all, upload_present
from trainctl.protocol import TMP_SUFFIX
from trainctl.store import Store

MANIFEST_DIR = ".trainctl"


def manifest_key(rank: int) -> str:
    return f"{MANIFEST_DIR}/node-{rank}.json"


def scan(local: Path) -> dict[str, Signature]:
    """Finished files under `local` (nothing that is, or sits in, a *.tmp path)."""
    found: dict[str, Signature] = {}
    if not local.is_dir():
        return found
    for path in local.rglob("*"):
        rel = path.relative_to(local)
        if any(part.endswith(TMP_SUFFIX) for part in rel.parts) or rel.parts[0] == MANIFEST_DIR:
            continue
        try:
            if path.is_file() and not path.is_symlink():
                st = path.stat()
                found[rel.as_posix()] = (st.st_size, st.st_mtime_ns)
        except FileNotFoundError:
            continue  # pruned while we looked
    return found


def stored_files(store: Store) -> dict[str, int]:
    """The union of every node's manifest: relative path -> size."""
    files: dict[str, int] = {}
    manifests = [i for i in store.list(MANIFEST_DIR) if i.key.endswith(".json")]
    for info in manifests:
        try:
            data = json.loads(store.get_text(info.key))
        except (NotFoundError, ValueError):
            continue
        files.update({str(k): int(v) for k, v in data.get("files", {}).items()})
    if not manifests:
        # A checkpoint URI filled by other means (a user's own upload): take it all.
        files = {i.key: i.size for i in store.list("") if not i.key.startswith(MANIFEST_DIR + "/")}
    return files


def restore(store: Store, local: Path, log: Callable[[str], None]) -> dict[str, Signature]:
    """Download the stored checkpoints into `local`; returns what is now known to be stored."""
    local.mkdir(parents=True, exist_ok=True)
    files = stored_files(store)
    started = time.monotonic()
    restored = download_all(
        store, {rel: local / rel for rel in files}, log, what="checkpoints", sizes=files
    )
    if restored:
        size = sum(s for s, _ in restored.values())
        log(
            f"checkpoints: restored {len(restored)} file(s), {size / 2**20:.1f} MiB "
            f"from {store.uri} in {time.monotonic() - started:.1f} s"
        )
    return restored


class CheckpointSync(PeriodicSync):
    """Uploads new and changed checkpoint files in the background, manifest last."""

    name = "checkpoint upload"

    def __init__(
        self,
        store: Store,
        local: Path,
        rank: int,
        *,
        interval: float,
        log: Callable[[str], None],
        known: dict[str, Signature] | None = None,
        workers: int = 8,
        on_state: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(interval=interval, log=log, on_state=on_state)
        self.store = store
        self.local = local
        self.rank = rank
        self.uploaded: dict[str, Signature] = dict(known or {})
        self.workers = workers
        self.uploads = 0
        self.bytes_uploaded = 0
        self.skipped = 0  # rewritten with the content already stored: not uploaded again

    def sync_once(self) -> int:
        """One pass: upload what changed, then the manifest, then delete what was pruned."""
        current = scan(self.local)
        changed = [rel for rel, sig in current.items() if self.uploaded.get(rel) != sig]
        changed = self.whole_only(
            changed, lambda rel: self.local / rel, current, shown=str,
            kept=self.uploaded.__contains__, what="checkpoints",
        )  # fmt: skip
        removed = [rel for rel in self.uploaded if rel not in current]
        # Rewritten with the same size: the same content too? (size + hash, as the store
        # can tell: S3's ETag). Only these are hashed; new files never are.
        for rel in [r for r in changed if r in self.uploaded]:
            if self.uploaded[rel][0] == current[rel][0] and self.store.matches(
                rel, self.local / rel
            ):
                self.uploaded[rel] = current[rel]
                self.skipped += 1
                changed.remove(rel)
        if not changed and not removed:
            return 0

        # From the sync thread (at a lower CPU priority once training runs) the store's
        # transfer threads start, and inherit that priority.
        went_up = upload_present(
            self.store, [(rel, self.local / rel) for rel in changed], workers=self.workers
        )
        gone = [rel for rel in changed if rel not in went_up]  # pruned since the scan
        for rel in gone:
            changed.remove(rel)
            if rel in self.uploaded:
                removed.append(rel)
        for rel in changed:
            self.uploaded[rel] = current[rel]
            self.bytes_uploaded += current[rel][0]
        self.uploads += len(changed)
        for rel in removed:
            del self.uploaded[rel]
        manifest = {
            "node": self.rank,
            "time": time.time(),
            "files": {rel: sig[0] for rel, sig in sorted(self.uploaded.items())},
        }
        self.store.put_text(manifest_key(self.rank), json.dumps(manifest))
        if changed:
            self.stored_state()
        for rel in removed:  # only once no manifest of ours lists them
            self.store.delete(rel)
        return len(changed)

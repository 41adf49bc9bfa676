"""Checkpoint sync between a node's checkpoint dir and the job's checkpoint URI.

Nodes do not share a disk: each uploads what appears in its own dir, and before an attempt
every node downloads the union of what all nodes uploaded. What is "in the store" is what
the nodes' manifests list (`.trainctl/node-<rank>.json`); a file is listed only after its
upload finished, and a manifest is replaced only after the files it adds are up, so a
partly uploaded checkpoint is never seen by a restore, and a file cut short while it was
written in place (node.sync.unfinished) never replaces its last whole copy. The training
helper library then picks the newest checkpoint that is complete across ranks (see
trainctl.train).

A file the script prunes (`Checkpointer(keep=3)`) leaves the store only once every other
node of the attempt has stored a copy of its state scanned after the prune (each manifest
says when its node scanned), or after PRUNE_WAIT_SECONDS: a node whose uploads lag behind
(a store outage, a slow link) and is then lost still finds, in the store, the other nodes'
files of the steps it got up. Pruning at once let the nodes' stored sets drift apart, with
no step complete across ranks: a relaunch from scratch although every rank had checkpoints.
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path

from trainctl.errors import NotFoundError
from trainctl.node.sync import PeriodicSync, Signature, download_all, upload_present
from trainctl.protocol import TMP_SUFFIX
from trainctl.store import Store

MANIFEST_DIR = ".trainctl"
# How long a pruned file stays in the store for a node that has not stored anything since
# (one that never checkpoints, or is gone): a bound on what the store keeps, not a wait.
PRUNE_WAIT_SECONDS = 900.0
# How often a node with pruned files looks at the other nodes' manifests (one listing, and
# a read of each manifest that changed since the last look).
PRUNE_CHECK_SECONDS = 5.0


def manifest_key(rank: int) -> str:
    return f"{MANIFEST_DIR}/node-{rank}.json"


def scan(local: Path) -> dict[str, Signature]:
    """Finished files under `local` (nothing that is, or sits in, a *.tmp path)."""
    found: dict[str, Signature] = {}
    if not local.is_dir():
        return found
    # os.walk, not Path.rglob: a script that rotates its checkpoints deletes a step's
    # directory between the listing of its parent and the look inside it, which rglob
    # raises (FileNotFoundError) and os.walk passes over (errors go to onerror: none).
    for top, dirs, files in os.walk(local):
        here = Path(top).relative_to(local)
        dirs[:] = [
            d
            for d in dirs
            if not d.endswith(TMP_SUFFIX) and not (here == Path(".") and d == MANIFEST_DIR)
        ]
        for name in files:
            if name.endswith(TMP_SUFFIX) or (here == Path(".") and name == MANIFEST_DIR):
                continue
            try:
                st = os.stat(os.path.join(top, name), follow_symlinks=False)
            except FileNotFoundError:
                continue  # pruned while we looked
            if stat.S_ISREG(st.st_mode):
                found[(here / name).as_posix()] = (st.st_size, st.st_mtime_ns)
    return found


def stored_files(store: Store, log: Callable[[str], None] | None = None) -> dict[str, int]:
    """The union of every node's manifest: relative path -> size. A manifest that cannot be
    read (not JSON, not a mapping of paths to sizes) is one line in the log naming it, and
    every stored file no readable manifest lists is taken too: what is in the store is
    whole (a file is stored only once its upload finished), so nothing is lost for it."""
    files: dict[str, int] = {}
    manifests = [i for i in store.list(MANIFEST_DIR) if i.key.endswith(".json")]
    corrupt = False
    for info in manifests:
        try:
            files.update(manifest_files(store.get_bytes(info.key)))
        except NotFoundError:
            continue
        except ValueError as exc:
            corrupt = True
            if log is not None:  # (None: a look at what is stored, not a restore)
                log(
                    f"checkpoints: the manifest {store.url(info.key)} is unreadable ({exc}); "
                    "restoring every checkpoint file stored there instead"
                )
    if not manifests or corrupt:
        # A checkpoint URI filled by other means (a user's own upload): take it all.
        stored = store.list("")
        found = {i.key: i.size for i in stored if not i.key.startswith(MANIFEST_DIR + "/")}
        files = {**found, **files} if corrupt else found
    return files


def manifest_files(raw: bytes) -> dict[str, int]:
    """A node's checkpoint manifest's files (relative path -> size); ValueError saying what
    is wrong with it otherwise."""
    try:
        data = json.loads(raw)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    except ValueError:  # (UnicodeDecodeError too)
        raise ValueError("not JSON") from None
    entries = data.get("files") if isinstance(data, dict) else None
    if not isinstance(entries, dict):
        raise ValueError("not a manifest: no mapping of files")
    files: dict[str, int] = {}
    for rel, size in entries.items():
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ValueError(f"{rel[:80]!r} has size {str(size)[:40]!r}, not a byte count")
        files[rel] = size
    return files


def restore(
    store: Store,
    local: Path,
    log: Callable[[str], None],
    *,
    left_out: list[str] | None = None,
) -> dict[str, Signature]:
    """Download the stored checkpoints into `local`; returns what is now known to be stored.
    A Trainer's `checkpoint-<n>/` without its trainer_state.json, or a DCP folder without its
    .metadata (their last files: the node was lost while it wrote them), is not restored:
    the script would resume from a checkpoint that is not there. Each is added to
    `left_out` (as 'folder/')."""
    from trainctl.node.settled import incomplete_folders

    local.mkdir(parents=True, exist_ok=True)
    files = stored_files(store, log)
    # ("./": incomplete_folders skips a working directory's roots, the first component;
    # here every folder of the checkpoint dir counts, its top level included.)
    for folder, last in sorted(incomplete_folders(f"./{rel}" for rel in files).items()):
        inner = folder.removeprefix("./")
        files = {rel: size for rel, size in files.items() if not rel.startswith(inner + "/")}
        log(f"checkpoints: {inner}/ was being written when its node last copied it: not "
            f"restored: no {last}")  # fmt: skip
        if left_out is not None:
            left_out.append(f"{inner}/")
    started = time.monotonic()
    restored = download_all(
        store,
        {rel: local / rel for rel in files},
        log,
        what="checkpoints",
        sizes=files,
        root=local,  # (a persistent checkpoint_local_path may hold a link an attempt left)
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
        nodes: int = 1,
    ) -> None:
        """`nodes`: how many nodes the attempt has (whose manifests a prune waits for)."""
        super().__init__(interval=interval, log=log, on_state=on_state)
        self.store = store
        self.local = local
        self.rank = rank
        self.nodes = nodes
        self.uploaded: dict[str, Signature] = dict(known or {})
        self.workers = workers
        self.uploads = 0
        self.bytes_uploaded = 0
        self.skipped = 0  # rewritten with the content already stored: not uploaded again
        # Pruned here, still in the store and in the manifest: path -> (size, pruned at)
        self.pending: dict[str, tuple[int, float]] = {}
        # Other nodes' manifests as last read: rank -> ((listed mtime, size), scanned at)
        self._others: dict[int, tuple[tuple[float, int], float]] = {}
        self._next_look = 0.0
        self._trained = False  # the script succeeded: nothing pruned is needed any more

    def close(self, *, trained: bool = False) -> None:
        """The last pass; `trained`: the node's script succeeded (training is over, so what
        it pruned leaves the store now, whoever has caught up)."""
        self._trained = trained
        super().close()

    def _scanned_by_others(self) -> float:
        """The earliest time at which another node of the attempt scanned what its stored
        manifest lists (inf: no other node has one). One listing of the manifests, and a
        read of those that changed since the last look."""
        if self.nodes <= 1:
            return float("inf")
        listed = {}
        for info in self.store.list(MANIFEST_DIR):
            name = info.key.rsplit("/", 1)[-1]
            rank = name.removeprefix("node-").removesuffix(".json")
            if rank.isdigit() and int(rank) != self.rank and int(rank) < self.nodes:
                listed[int(rank)] = (info.mtime, info.size)
        earliest = float("inf")
        for rank, seen in listed.items():
            cached = self._others.get(rank)
            if cached is None or cached[0] != seen:
                try:
                    data = json.loads(self.store.get_text(manifest_key(rank)))
                    scanned = float(data.get("scanned", 0))
                except (NotFoundError, ValueError, TypeError, AttributeError):
                    scanned = 0.0  # unreadable now (or an older trainctl's): not caught up
                cached = (seen, scanned)
                self._others[rank] = cached
            earliest = min(earliest, cached[1])
        return earliest

    def _deletable(self, now: float) -> list[str]:
        """The pruned files that may leave the store now (see the module's doc)."""
        if self._trained and self.last_pass:
            return list(self.pending)
        if not self.pending or (now < self._next_look and not self.last_pass):
            return []
        self._next_look = now + PRUNE_CHECK_SECONDS
        others = self._scanned_by_others()
        late = {r for r, (_, pruned) in self.pending.items() if others <= pruned}
        overdue = {r for r in late if now - self.pending[r][1] > PRUNE_WAIT_SECONDS}
        if overdue:
            self.log(
                f"checkpoints: {len(overdue)} pruned file(s) deleted from the store after "
                f"{PRUNE_WAIT_SECONDS:.0f} s, although another node has stored nothing since"
            )
        return [r for r in self.pending if r not in late or r in overdue]

    def sync_once(self) -> int:
        """One pass: upload what changed, then the manifest, then delete what was pruned
        and what every other node has caught up with."""
        scanned = time.time()
        current = scan(self.local)
        changed = [rel for rel, sig in current.items() if self.uploaded.get(rel) != sig]
        changed = self.whole_only(
            changed, lambda rel: self.local / rel, current, shown=str,
            kept=self.uploaded.__contains__, what="checkpoints",
        )  # fmt: skip
        removed = [rel for rel in self.uploaded if rel not in current]
        for rel in removed:  # in the store (and the manifest) until the others catch up
            self.pending[rel] = (self.uploaded.pop(rel)[0], scanned)
        # Rewritten with the same size: the same content too? (size + hash, as the store
        # can tell: S3's ETag). Only these are hashed; new files never are.
        for rel in [r for r in changed if r in self.uploaded]:
            if self.uploaded[rel][0] == current[rel][0] and self.store.matches(
                rel, self.local / rel
            ):
                self.uploaded[rel] = current[rel]
                self.skipped += 1
                changed.remove(rel)
        deletable = self._deletable(scanned)
        if not changed and not removed and not deletable and not self._manifest_behind:
            return 0
        self._manifest_behind = True

        # From the sync thread (at a lower CPU priority once training runs) the store's
        # transfer threads start, and inherit that priority.
        went_up = upload_present(
            self.store,
            [(rel, self.local / rel) for rel in changed],
            workers=self.workers,
            roots=[self.local],
        )
        gone = [rel for rel in changed if rel not in went_up]  # pruned since the scan
        for rel in gone:
            changed.remove(rel)
            if rel in self.uploaded:
                self.pending[rel] = (self.uploaded.pop(rel)[0], scanned)
        for rel in changed:
            self.uploaded[rel] = current[rel]
            self.pending.pop(rel, None)  # written again: this copy replaces it
            self.bytes_uploaded += current[rel][0]
        self.uploads += len(changed)
        deleted = [rel for rel in deletable if rel in self.pending]
        for rel in deleted:
            del self.pending[rel]
        files = {rel: size for rel, (size, _) in self.pending.items()}
        files.update({rel: sig[0] for rel, sig in self.uploaded.items()})
        manifest = {
            "node": self.rank,
            "time": time.time(),
            "scanned": scanned,  # what it lists is this node's files as of then
            "files": dict(sorted(files.items())),
        }
        self.store.put_text(manifest_key(self.rank), json.dumps(manifest))
        self._manifest_behind = False
        self.stored_state(len(changed))
        for rel in deleted:  # only once no manifest of ours lists them
            self.store.delete(rel)
        return len(changed)

"""A node's working directory as part of the job's state.

What a script writes where it runs (the code directory, its working directory), in
SM_MODEL_DIR and in SM_OUTPUT_DATA_DIR is copied to the store while it trains, and put back
in place when a later attempt starts on a node of the same rank: on this machine or on new
capacity. A torchrun script that saves `snapshot.pt` to a relative path and loads it at
start when present then resumes after a relaunch, unchanged.

- Per node, except what every node wrote: a path that each node of the job kept (the DDP
  tutorial's `snapshot.pt`, saved by every node's local rank 0) is one replicated file, and
  every node restores its newest copy. A node lost without warning may not have copied its
  last version; taking its own older one would start the nodes at different epochs (and
  hang DDP). Files only some nodes wrote go back to their own node. (SageMaker's checkpoint
  directory goes further: every node gets every file, the last writer's copy winning.)

- Not kept: the files shipped with the source (the code is what the job's record names, never
  a copy from an earlier attempt), `__pycache__/` and `*.pyc`, files ending in `.tmp` (or in a
  `.tmp` directory: still being written), links, the checkpoint directory when it lies inside
  (it has its own sync), and what the job's `workdir_ignore` patterns (gitignore syntax)
  match. At most `workdir_max_mb` per node, newest files first; the rest is named in the log.
- Copied like checkpoints: a pass every `workdir_sync_seconds`, and a last one when the node
  ends for any reason (a notice, a stop, a failure; on success the model and output data go
  up packed instead).
- Never torn: each new version of a file goes to a key of its own, and the node's manifest
  (`node-<rank>/manifest.json`, written after the files it lists) names the versions of the
  newest complete copy; a file that changed while it was uploaded is tried again next pass,
  and one whose format says it is cut short (a `torch.save` in place caught between its open
  and its last write, or stopped there: see node.sync.unfinished) never replaces its last
  whole copy.

Store layout, under `jobs/<job>/workdir/`: `node-<rank>/manifest.json` and
`node-<rank>/a<attempt>-p<pass>/<root>/<path>` where root is code, model or output.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from trainctl.errors import NotFoundError
from trainctl.node.sync import (
    SAVED_STATE_SUFFIXES,
    PeriodicSync,
    Signature,
    download_all,
    signature,
    size_text,
    upload_present,
)
from trainctl.protocol import TMP_SUFFIX
from trainctl.store import Store

# Never state: Python's byte code, and what a notebook server leaves beside a notebook.
DEFAULT_IGNORE = ("__pycache__/", "*.py[cod]", ".ipynb_checkpoints/")
# Roots whose files go up packed on success (model.tar.gz, output.tar.gz): not copied twice.
PACKED_ROOTS = ("model", "output")


def manifest_key(rank: int) -> str:
    return f"node-{rank}/manifest.json"


def ignore_spec(patterns: Iterable[str]) -> Any:
    """The default patterns and the job's, as one gitignore-style matcher."""
    import pathspec

    return pathspec.GitIgnoreSpec.from_lines([*DEFAULT_IGNORE, *patterns])


def normalise_member(name: str) -> str:
    """A source archive member as a path relative to the code dir ('./a//b' -> 'a/b')."""
    return os.path.normpath(name).replace(os.sep, "/").lstrip("/")


@dataclass
class StateRoots:
    """Where a node's state lives: root name -> local directory, and what in them is not
    state (the shipped source files under 'code', a nested checkpoint dir, the patterns)."""

    dirs: dict[str, Path]
    shipped: frozenset[str] = frozenset()  # paths relative to the 'code' root
    skip_dirs: tuple[Path, ...] = ()
    ignore: Any = None  # a pathspec matcher (see ignore_spec)

    def path(self, rel: str) -> Path | None:
        """The local path of a state path 'root/relative', or None if it does not name one
        inside its root (a manifest read from the store is checked before it is trusted)."""
        root, _, inner = rel.partition("/")
        if root not in self.dirs or not inner:
            return None
        pure = PurePosixPath(inner)
        if pure.is_absolute() or any(part in ("", ".", "..") for part in pure.parts):
            return None
        if root == "code" and inner in self.shipped:
            return None  # the code is the record's, never an earlier attempt's copy
        return self.dirs[root].joinpath(*pure.parts)

    def scan(self, roots: Iterable[str] | None = None) -> dict[str, Signature]:
        """Every file that is state, as 'root/relative' -> (size, mtime_ns)."""
        found: dict[str, Signature] = {}
        for name in roots or self.dirs:
            base = self.dirs[name]
            if not base.is_dir():
                continue
            for dirpath, dirnames, filenames in os.walk(base, followlinks=False):
                here = Path(dirpath)
                rel_dir = here.relative_to(base).as_posix()
                prefix = "" if rel_dir == "." else rel_dir + "/"
                dirnames[:] = [
                    d
                    for d in dirnames
                    if not d.endswith(TMP_SUFFIX)
                    and here / d not in self.skip_dirs
                    and not self._ignored(prefix + d + "/")
                ]
                for leaf in filenames:
                    rel = prefix + leaf
                    if leaf.endswith(TMP_SUFFIX) or self._ignored(rel):
                        continue
                    if name == "code" and rel in self.shipped:
                        continue
                    sig = signature(here / leaf)
                    if sig is not None:
                        found[f"{name}/{rel}"] = sig
        return found

    def _ignored(self, rel: str) -> bool:
        return self.ignore is not None and self.ignore.match_file(rel)


@dataclass
class NodeRestore:
    """What a node put back before its script started."""

    files: int = 0
    bytes: int = 0
    from_attempt: int | None = None
    largest: list[str] = field(default_factory=list)  # up to 3 paths, largest first
    # 'root/path' -> (local signature, store key): what is in the store already
    known: dict[str, tuple[Signature, str]] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        return {
            "files": self.files,
            "bytes": self.bytes,
            "from_attempt": self.from_attempt,
            "largest": self.largest,
        }


def shown(rel: str) -> str:
    """A state path as its user knows it: relative to the working directory for the code
    root, else under SM_MODEL_DIR / SM_OUTPUT_DATA_DIR."""
    root, _, inner = rel.partition("/")
    return inner if root == "code" else f"{root}/{inner}"


def stored_manifests(store: Store, log: Callable[[str], None]) -> dict[int, dict[str, Any]]:
    """rank -> that node's manifest: its newest complete copy (`files`: 'root/path' ->
    {key, size, mtime_ns}) and the attempt that wrote it (`attempt`)."""
    manifests: dict[int, dict[str, Any]] = {}
    for name in store.list_dirs(""):
        if not (name.startswith("node-") and name[5:].isdigit()):
            continue
        rank = int(name[5:])
        try:
            manifest = json.loads(store.get_text(manifest_key(rank)))
            if not isinstance(manifest.get("files"), dict):
                raise TypeError("files is not a mapping")
        except NotFoundError:
            continue
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            log(f"working directory: node {rank}'s stored copy is unreadable ({exc}); not used")
            continue
        manifests[rank] = manifest
    return manifests


def restore_plan(manifests: dict[int, dict[str, Any]], rank: int) -> dict[str, tuple[int, dict]]:
    """What node `rank` restores: 'root/path' -> (the node whose copy, its entry).

    Its own files; and a path that every node of the earlier attempt kept (the DDP tutorial's
    `snapshot.pt`, written by each node's local rank 0) is one replicated file: every node
    takes its newest copy, so all resume from the same point even when a node was lost
    before its last copy went up, and a node new to the job (an elastic job grown) gets it.
    """
    plan: dict[str, tuple[int, dict]] = {
        rel: (rank, entry)
        for rel, entry in manifests.get(rank, {}).get("files", {}).items()
        if isinstance(entry, dict)
    }
    if len(manifests) < 2:
        return plan
    everyone = set.intersection(*(set(m["files"]) for m in manifests.values()))
    for rel in everyone:
        copies = [(node, m["files"][rel]) for node, m in manifests.items()]
        copies = [(node, e) for node, e in copies if isinstance(e, dict)]
        if copies:
            plan[rel] = max(copies, key=lambda c: (_int(c[1], "mtime_ns"), c[0] == rank))
    return plan


def _int(entry: dict, name: str) -> int:
    value = entry.get(name)
    return value if isinstance(value, int) and value >= 0 else 0


def restore(store: Store, rank: int, roots: StateRoots, log: Callable[[str], None]) -> NodeRestore:
    """Put back the newest complete copy of this rank's state (see restore_plan)."""
    manifests = stored_manifests(store, log)
    targets: dict[str, tuple[str, Path, int, dict]] = {}  # key -> (rel, path, node, entry)
    for rel, (node, entry) in restore_plan(manifests, rank).items():
        path = roots.path(str(rel))
        key = entry.get("key")
        if path is None or not isinstance(key, str) or not key.startswith(f"node-{node}/"):
            log(f"working directory: skipping {rel!r} (not a path inside the node's dirs)")
            continue
        targets[key] = (str(rel), path, node, entry)
    if not targets:
        return NodeRestore()
    started = time.monotonic()
    arrived = download_all(
        store,
        {key: target[1] for key, target in targets.items()},
        log,
        what="working directory",
        sizes={key: _int(target[3], "size") for key, target in targets.items()},
    )
    sources = {targets[key][2] for key in arrived}
    attempts = [a for n in sources if isinstance(a := manifests[n].get("attempt"), int)]
    result = NodeRestore(from_attempt=max(attempts, default=None))
    sizes: dict[str, int] = {}
    for key, (size, _) in arrived.items():
        rel, path, node, entry = targets[key]
        written = _int(entry, "mtime_ns")
        if written:  # the time it was written, not restored: what "newest" compares
            os.utime(path, ns=(written, written))
        if node == rank:  # another node's copy is uploaded again as this node's own
            result.known[rel] = (signature(path) or (size, written), key)
        sizes[rel] = size
    result.files = len(sizes)
    result.bytes = sum(sizes.values())
    result.largest = [shown(rel) for rel in sorted(sizes, key=lambda r: -sizes[r])[:3]]
    if result.files:
        names = ", ".join(result.largest) + (" ..." if result.files > 3 else "")
        log(
            f"working directory: restored {result.files} file(s), {size_text(result.bytes)} "
            f"from attempt {result.from_attempt} ({names}) in {time.monotonic() - started:.1f} s"
        )
    return result


class WorkdirSync(PeriodicSync):
    """Copies a node's state to the store: new and changed files under keys of their own,
    then the manifest, then the versions it no longer names are deleted."""

    name = "working directory upload"

    def __init__(
        self,
        store: Store,
        rank: int,
        attempt: int,
        roots: StateRoots,
        *,
        max_bytes: int,
        interval: float,
        log: Callable[[str], None],
        known: dict[str, tuple[Signature, str]] | None = None,
        on_state: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(interval=interval, log=log, on_state=on_state)
        self.store = store
        self.rank = rank
        self.attempt = attempt
        self.roots = roots
        self.max_bytes = max_bytes
        self.known: dict[str, tuple[Signature, str]] = dict(known or {})
        self.passes = 0
        self.uploads = 0
        self._left_out: frozenset[str] = frozenset()

    def _within_cap(self, current: dict[str, Signature]) -> dict[str, Signature]:
        """The newest files up to max_bytes; the ones left out are named once per change."""
        kept: dict[str, Signature] = {}
        total = 0
        for rel, sig in sorted(current.items(), key=lambda item: -item[1][1]):
            if total + sig[0] <= self.max_bytes:
                kept[rel] = sig
                total += sig[0]
        left = frozenset(current) - frozenset(kept)
        if left and left != self._left_out:
            size = sum(current[rel][0] for rel in left)
            names = sorted(left, key=lambda rel: -current[rel][0])
            listed = ", ".join(shown(rel) for rel in names[:3]) + (" ..." if len(left) > 3 else "")
            self.log(
                f"working directory: {len(left)} file(s), {size_text(size)} not kept: over "
                f"workdir_max_mb ({self.max_bytes / 2**20:g} MB per node) ({listed}); newer files "
                "go first, workdir_ignore leaves files out"
            )
        self._left_out = left
        return kept

    def sync_once(self, roots: Iterable[str] | None = None) -> int:
        """One pass over `roots` (default all): returns how many files went up. The entries
        of roots not scanned stay as they are."""
        scanned = tuple(roots or self.roots.dirs)
        current = self._within_cap(self.roots.scan(scanned))
        in_scope = {rel for rel in self.known if rel.split("/", 1)[0] in scanned}
        changed = [rel for rel, sig in current.items() if self.known.get(rel, (None,))[0] != sig]
        changed = self.whole_only(
            changed, self.roots.path, current, shown=shown, kept=self.known.__contains__,
            what="working directory",
        )  # fmt: skip
        removed = [rel for rel in in_scope if rel not in current]
        if not changed and not removed:
            return 0
        self.passes += 1
        version = f"node-{self.rank}/a{self.attempt}-p{self.passes}"
        keys = {rel: f"{version}/{rel}" for rel in changed}
        paths = {rel: self.roots.path(rel) for rel in changed}
        uploaded = upload_present(
            self.store, [(keys[rel], p) for rel, p in paths.items() if p is not None]
        )
        stale: list[str] = []
        uploaded_rels: list[str] = []
        for rel in changed:
            if keys[rel] not in uploaded:
                continue
            path = paths[rel]
            if path is None or signature(path) != current[rel]:
                stale.append(keys[rel])  # written to while it went up: next pass
                continue
            if rel in self.known:
                stale.append(self.known[rel][1])
            self.known[rel] = (current[rel], keys[rel])
            self.uploads += 1
            uploaded_rels.append(rel)
        for rel in removed:
            stale.append(self.known.pop(rel)[1])
        manifest = {
            "node": self.rank,
            "attempt": self.attempt,
            "time": time.time(),
            "files": {
                rel: {"key": key, "size": sig[0], "mtime_ns": sig[1]}
                for rel, (sig, key) in sorted(self.known.items())
            },
        }
        self.store.put_text(manifest_key(self.rank), json.dumps(manifest))
        if any(PurePosixPath(r).suffix.lower() in SAVED_STATE_SUFFIXES for r in uploaded_rels):
            self.stored_state()  # a snapshot.pt, not just any file the script wrote
        for key in stale:  # only once the manifest no longer names them
            try:
                self.store.delete(key)
            except Exception as exc:  # an orphaned version costs space, not correctness
                self.log(f"working directory: could not delete {key}: {exc}")
        return len(uploaded)

    def close(self, *, outputs: bool = True) -> None:
        """The last pass. `outputs=False` (the node succeeded: its model and output data go
        up packed) copies the working directory alone, not the same bytes twice."""
        self.halt()
        roots = None if outputs else [r for r in self.roots.dirs if r not in PACKED_ROOTS]
        with self._lock:
            self.sync_once(roots)

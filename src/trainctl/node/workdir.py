"""A node's working directory as part of the job's state.

What a script writes where it runs (the code directory, its working directory), in
SM_MODEL_DIR and in SM_OUTPUT_DATA_DIR is copied to the store while it trains, and put back
in place when a later attempt starts: on this machine or on new capacity. A torchrun script
that saves `snapshot.pt` to a relative path and loads it at start when present then resumes
after a relaunch, unchanged, whichever rank saved it.

- Every node gets every file (SageMaker's checkpoint-directory rule): a file one node wrote
  (global rank 0's `snapshot.pt` in today's DDP tutorial, Lightning's `checkpoints/last.ckpt`,
  a Hugging Face Trainer's `checkpoint-500/`, each rank's `rng_state_<rank>.pth`) is restored
  on every node of the next attempt, whatever its rank, on new capacity too. A path several
  nodes wrote (each node's local rank 0 saving `snapshot.pt`, the tutorial before 2025) comes
  back as its newest copy everywhere: one coherent version, even when a node was lost before
  its last copy went up. Every node computes the same plan from the same manifests, so the
  nodes of an attempt start from the same files (the controller checks: see
  controller.restores).
- A copy restored from another node is not uploaded again as this node's own while it is
  unchanged (the store holds it once); once the script rewrites it, it is this node's.

- Not kept: the files shipped with the source (the code is what the job's record names, never
  a copy from an earlier attempt), `__pycache__/` and `*.pyc`, files ending in `.tmp` (or in a
  `.tmp` directory: still being written), links, the checkpoint directory when it lies inside
  (it has its own sync), and what the job's `workdir_ignore` patterns (gitignore syntax)
  match. At most `workdir_max_mb` per node, newest files first, both ways: what a node keeps
  in the store, and what it restores of all the nodes' files; the rest is named in the log.
- Copied like checkpoints: a pass every `workdir_sync_seconds`, and a last one when the node
  ends for any reason (a notice, a stop, a failure; on success the model and output data go
  up packed instead).
- Never torn: each new version of a file goes to a key of its own, and the node's manifest
  (`node-<rank>/manifest.json`, written after the files it lists) names the versions of the
  newest complete copy; a file that changed while it was uploaded goes up next pass from a
  frozen local copy (one rewritten every epoch still reaches the store when its upload
  takes longer than an epoch), and one whose format says it is cut short (a `torch.save`
  in place caught between its open and its last write, or stopped there: see
  node.sync.unfinished) never replaces its last whole copy.

- Never half a folder: the manifest's `files` (what a relaunch restores) name each unit of
  the node's files (a file, or a folder written together: a Trainer's checkpoint-<n>/) as of
  the newest pass at which it was settled; `pending` the newer copies (node.settled).

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
from trainctl.node.settled import Settled, folder_kind, incomplete_folders, unit_of
from trainctl.node.sync import (
    SAVED_STATE_SUFFIXES,
    PeriodicSync,
    Signature,
    download_all,
    frozen_copy,
    signature,
    size_text,
    upload_present,
)
from trainctl.protocol import TMP_SUFFIX
from trainctl.store import Store

# Never state: Python's byte code, and what a notebook server leaves beside a notebook.
DEFAULT_IGNORE = ("__pycache__/", "*.py[cod]", ".ipynb_checkpoints/")
# Saved-state files a node's report of its restore lists (the controller compares them).
STATE_FILES_REPORTED = 500
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
    # 'root/path' -> (local signature, store key): this node's own copies in the store
    known: dict[str, tuple[Signature, str]] = field(default_factory=dict)
    # 'root/path' -> local signature: another node's copies, not uploaded again unchanged
    borrowed: dict[str, Signature] = field(default_factory=dict)
    # This node's own stored versions that a newer copy of another node's replaced: deleted
    # once a manifest no longer names them.
    superseded: list[str] = field(default_factory=list)
    # Saved state put back (SAVED_STATE_SUFFIXES): shown path -> which copy (see state_entry)
    state: dict[str, dict[str, int | None]] = field(default_factory=dict)
    left_out: int = 0  # files not restored: over workdir_max_mb
    # Paths being written when the earlier attempt ended: restored as before, or not at all
    unsettled: list[str] = field(default_factory=list)

    def newest(self) -> str | None:
        """The newest saved state put back, as a script resumes from it: its folder where it
        lies in one ('out/checkpoint-800/'), else the file ('snapshot.pt')."""
        if not self.state:
            return None
        path = max(self.state, key=lambda p: (self.state[p]["written_ms"] or 0, p))
        folder = path.rpartition("/")[0]
        names = [p.rpartition("/")[2] for p in self.state if p.rpartition("/")[0] == folder]
        return f"{folder}/" if folder and folder_kind(folder, names) else path

    def summary(self) -> dict[str, Any]:
        return {
            "files": self.files,
            "bytes": self.bytes,
            "from_attempt": self.from_attempt,
            "largest": self.largest,
            # the newest saved-state files, bounded for a node that keeps thousands
            "state": dict(
                sorted(self.state.items(), key=lambda i: (-(i[1]["written_ms"] or 0), i[0]))[
                    :STATE_FILES_REPORTED
                ]
            ),
            "left_out": self.left_out,
            "unsettled": self.unsettled[:STATE_FILES_REPORTED],
            "newest": self.newest(),
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
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
            why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:200]
            log(
                f"working directory: the manifest {store.url(manifest_key(rank))} is "
                f"unreadable ({why}); node {rank}'s stored copy is not restored"
            )
            continue
        manifests[rank] = manifest
    return manifests


@dataclass(frozen=True)
class RestorePlan:
    """What a node restores: 'root/path' -> (the node whose copy, its entry), and the paths
    left out for the size cap, largest first."""

    copies: dict[str, tuple[int, dict]]
    left_out: list[str]
    left_out_bytes: int


def restore_plan(
    manifests: dict[int, dict[str, Any]], rank: int, max_bytes: int | None = None
) -> RestorePlan:
    """What node `rank` restores: every path any node kept, each as its newest copy (the
    node's own on a tie, then the lowest rank's). Within `max_bytes`, newest first: every
    node computes the same choice from the same manifests, so a cap never splits them."""
    newest: dict[str, tuple[int, dict]] = {}
    for node in sorted(manifests):
        for rel, entry in manifests[node]["files"].items():
            if not isinstance(entry, dict):
                continue
            best = newest.get(rel)
            if best is None or (_int(entry, "mtime_ns"), node == rank) > (
                _int(best[1], "mtime_ns"),
                best[0] == rank,
            ):
                newest[rel] = (node, entry)
    if max_bytes is None:
        return RestorePlan(newest, [], 0)
    kept: dict[str, tuple[int, dict]] = {}
    left: list[str] = []
    total = 0
    for rel, copy in sorted(newest.items(), key=lambda i: (-_int(i[1][1], "mtime_ns"), i[0])):
        size = _int(copy[1], "size")
        if total + size <= max_bytes:
            kept[rel] = copy
            total += size
        else:
            left.append(rel)
    left.sort(key=lambda rel: -_int(newest[rel][1], "size"))
    return RestorePlan(kept, left, sum(_int(newest[rel][1], "size") for rel in left))


def _int(entry: dict, name: str) -> int:
    value = entry.get(name)
    return value if isinstance(value, int) and value >= 0 else 0


def _superseded(own_manifest: dict[str, Any], plan: RestorePlan, rank: int) -> list[str]:
    """This node's stored versions no manifest will name once it writes its own: its copies
    that a newer one of another node's replaces, and its newer copies that never settled."""
    own = own_manifest.get("files", {})
    keys = []
    for rel, (node, _) in plan.copies.items():
        mine = own.get(rel)
        if node != rank and isinstance(mine, dict) and isinstance(mine.get("key"), str):
            keys.append(mine["key"])
    named = {e.get("key") for e in own.values() if isinstance(e, dict)}
    pending = own_manifest.get("pending", {})
    for entry in pending.values() if isinstance(pending, dict) else []:
        key = entry.get("key") if isinstance(entry, dict) else None
        if isinstance(key, str) and key.startswith(f"node-{rank}/") and key not in named:
            keys.append(key)
    return keys


def _left_as_before(
    manifests: dict[int, dict[str, Any]], plan: RestorePlan, log: Callable[[str], None]
) -> list[str]:
    """What was being written when the earlier attempt ended, as the user knows the paths:
    each node's units whose newest copy never settled (restored as they were before, or
    not at all), and the folders the nodes' copies leave without the checkpoint's last
    file (taken out of `plan`: restoring part of a checkpoint has a script resume from one
    that is not there)."""
    said: dict[str, str] = {}
    for manifest in manifests.values():
        files, pending = manifest["files"], manifest.get("pending")
        if not isinstance(pending, dict):
            continue
        names: dict[str, set[str]] = {}
        for rel in [*files, *pending]:
            names.setdefault(rel.rpartition("/")[0], set()).add(rel.rpartition("/")[2])
        for rel in pending:
            unit = unit_of(rel, lambda folder, listed=names: listed.get(folder, ()))
            kept = any(r.startswith(unit) for r in files) if unit.endswith("/") else rel in files
            said.setdefault(shown(unit), "restored as it was before" if kept else "not restored")
        writing = manifest.get("writing")
        for rel in writing if isinstance(writing, list) else []:  # caught torn
            if isinstance(rel, str):
                how = "restored as it was before" if rel in files else "not restored"
                said.setdefault(shown(rel), how)
    for folder, last in sorted(incomplete_folders(plan.copies).items()):
        for rel in [r for r in plan.copies if r.startswith(folder + "/")]:
            del plan.copies[rel]
        said[shown(folder + "/")] = f"not restored: no {last}"
    for path, how in sorted(said.items()):
        log(f"working directory: {path} was being written when its node last copied it: {how}")
    return sorted(said)


def state_entry(node: int, manifest: dict[str, Any], entry: dict) -> dict[str, int | None]:
    """Which copy of a saved-state file a node put back: the node that wrote it, in which
    attempt, and when (ms): the controller compares these across the nodes of an attempt."""
    attempt = manifest.get("attempt")
    return {
        "node": node,
        "attempt": attempt if isinstance(attempt, int) else None,
        "written_ms": _int(entry, "mtime_ns") // 10**6,
        "size": _int(entry, "size"),
    }


def restore(
    store: Store,
    rank: int,
    roots: StateRoots,
    log: Callable[[str], None],
    *,
    max_bytes: int | None = None,
) -> NodeRestore:
    """Put back the newest complete copy of every node's state (see restore_plan)."""
    manifests = stored_manifests(store, log)
    plan = restore_plan(manifests, rank, max_bytes)
    unsettled = _left_as_before(manifests, plan, log)
    if plan.left_out:
        listed = ", ".join(shown(r) for r in plan.left_out[:3])
        more = " ..." if len(plan.left_out) > 3 else ""
        log(
            f"working directory: {len(plan.left_out)} file(s), {size_text(plan.left_out_bytes)} "
            f"not restored: over workdir_max_mb ({(max_bytes or 0) / 2**20:g} MB per node) "
            f"({listed}{more}); newer files go first"
        )
    targets: dict[str, tuple[str, Path, int, dict]] = {}  # key -> (rel, path, node, entry)
    for rel, (node, entry) in plan.copies.items():
        path = roots.path(str(rel))
        key = entry.get("key")
        if path is None or not isinstance(key, str) or not key.startswith(f"node-{node}/"):
            log(f"working directory: skipping {rel!r} (not a path inside the node's dirs)")
            continue
        targets[key] = (str(rel), path, node, entry)
    result = NodeRestore(left_out=len(plan.left_out), unsettled=unsettled)
    result.superseded = _superseded(manifests.get(rank, {}), plan, rank)
    if not targets:
        return result
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
    result.from_attempt = max(attempts, default=None)
    sizes: dict[str, int] = {}
    for key, (size, _) in arrived.items():
        rel, path, node, entry = targets[key]
        written = _int(entry, "mtime_ns")
        if written:  # the time it was written, not restored: what "newest" compares
            os.utime(path, ns=(written, written))
        local = signature(path) or (size, written)
        if node == rank:
            result.known[rel] = (local, key)
        else:
            result.borrowed[rel] = local
        if PurePosixPath(rel).suffix.lower() in SAVED_STATE_SUFFIXES:
            result.state[shown(rel)] = state_entry(node, manifests[node], entry)
        sizes[rel] = size
    result.files = len(sizes)
    result.bytes = sum(sizes.values())
    result.largest = [shown(rel) for rel in sorted(sizes, key=lambda r: -sizes[r])[:3]]
    if result.files:
        names = ", ".join(result.largest) + (" ..." if result.files > 3 else "")
        nodes = ", ".join(f"algo-{n + 1}" for n in sorted(sources))
        log(
            f"working directory: restored {result.files} file(s), {size_text(result.bytes)} "
            f"from attempt {result.from_attempt} ({names}; written by {nodes}) in "
            f"{time.monotonic() - started:.1f} s"
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
        borrowed: dict[str, Signature] | None = None,
        superseded: Iterable[str] = (),
        on_state: Callable[[], None] | None = None,
        staging: Path | None = None,
    ) -> None:
        """`known`, `borrowed` and `superseded`: what the node's restore left (NodeRestore).
        `staging`: a private directory outside the roots for the frozen copies of files
        that change faster than they go up (None: such a file waits for a quiet moment)."""
        super().__init__(interval=interval, log=log, on_state=on_state)
        self.store = store
        self.rank = rank
        self.attempt = attempt
        self.roots = roots
        self.max_bytes = max_bytes
        self.known: dict[str, tuple[Signature, str]] = dict(known or {})
        self.borrowed: dict[str, Signature] = dict(borrowed or {})
        self._superseded = list(superseded)
        self.passes = 0
        self.uploads = 0
        self._left_out: frozenset[str] = frozenset()
        self.staging = staging
        # Files rewritten while they went up: from then on a frozen copy of each goes up
        # (node.sync.frozen_copy), or a file saved every epoch would reach the store only
        # when the node ends, if its upload takes longer than an epoch.
        self.moving: set[str] = set()
        self.frozen = 0  # uploads made from a frozen copy
        # What a relaunch restores: each unit as of the pass it was last settled at
        # (node.settled); `known` above is the newest stored copy of every file.
        self.settled = Settled(self.known)
        self._retired: list[str] = []  # replaced versions the settled state still names
        self.ended_cleanly = False  # the script ended by itself: the last pass waives the age
        self.writing: set[str] = set()  # files the newest pass caught torn (being written)

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
        started = time.time()
        scanned = tuple(roots or self.roots.dirs)
        # Another node's copy, unchanged here, is that node's to keep (and not in this
        # node's cap); once the script rewrites it, it is this node's.
        scan = self.roots.scan(scanned)
        current = self._within_cap(
            {rel: sig for rel, sig in scan.items() if self.borrowed.get(rel) != sig}
        )
        in_scope = {rel for rel in self.known if rel.split("/", 1)[0] in scanned}
        candidates = [r for r, sig in current.items() if self.known.get(r, (None,))[0] != sig]
        changed = self.whole_only(
            candidates, self.roots.path, current, shown=shown, kept=self.known.__contains__,
            what="working directory",
        )  # fmt: skip
        self._caught_writing(scanned, set(candidates) - set(changed))
        removed = [rel for rel in in_scope if rel not in current]
        waiting = self.settled.published != self.known  # a unit not settled yet may be now
        if not (changed or removed or self._superseded or self._manifest_behind or waiting):
            return 0
        self.passes += 1
        version = f"node-{self.rank}/a{self.attempt}-p{self.passes}"
        keys = {rel: f"{version}/{rel}" for rel in changed}
        paths = {rel: self.roots.path(rel) for rel in changed}
        sources = self._freeze(paths, current)
        try:
            roots = [*self.roots.dirs.values(), *([self.staging] if self.staging else [])]
            uploaded = upload_present(
                self.store,
                [(keys[rel], sources[rel]) for rel in changed if rel in sources],
                roots=roots,
            )
        finally:
            self._thaw()
        stale: list[str] = []
        uploaded_rels: list[str] = []
        for rel in changed:
            if keys[rel] not in uploaded:
                continue
            path = paths[rel]
            if path is None or (sources[rel] == path and signature(path) != current[rel]):
                stale.append(keys[rel])  # written to while it went up: a frozen copy next
                self.moving.add(rel)
                continue
            if rel in self.known:
                stale.append(self.known[rel][1])
            self.borrowed.pop(rel, None)  # rewritten here: this node's own from now on
            self.known[rel] = (current[rel], keys[rel])
            self.uploads += 1
            uploaded_rels.append(rel)
        for rel in removed:
            stale.append(self.known.pop(rel)[1])
        published = self._settle(scanned, scan, current, started)
        if changed or removed or published or self._superseded or self._manifest_behind:
            self._manifest_behind = True
            self.store.put_text(manifest_key(self.rank), json.dumps(self._manifest()))
            self._manifest_behind = False
        stale += self._superseded + self._retired
        self._superseded = []
        saved = [  # a snapshot.pt, not just any file the script wrote
            r
            for r in published
            if r in self.settled.published
            and PurePosixPath(r).suffix.lower() in SAVED_STATE_SUFFIXES
        ]
        self.stored_state(len(saved))
        named = self.settled.referenced() | {key for _, key in self.known.values()}
        self._retired = [key for key in stale if key in named]
        for key in stale:  # only once the manifest no longer names them
            if key in named:
                continue
            try:
                self.store.delete(key)
            except Exception as exc:  # an orphaned version costs space, not correctness
                self.log(f"working directory: could not delete {key}: {exc}")
        return len(uploaded)

    def _caught_writing(self, scanned: tuple[str, ...], torn: set[str]) -> None:
        """The files of `scanned` this pass caught being written (a torn copy not stored:
        see whole_only), in the manifest: a kill now restores each as it was before, or
        not at all, and the relaunch says so."""
        writing = {rel for rel in self.writing if rel.split("/", 1)[0] not in scanned} | torn
        if writing != self.writing:
            self.writing = writing
            self._manifest_behind = True

    def _settle(
        self,
        scanned: tuple[str, ...],
        before: dict[str, Signature],
        current: dict[str, Signature],
        started: float,
    ) -> list[str]:
        """Bring the settled state up to this pass (node.settled); the paths it changed."""
        after = {
            rel: sig
            for rel, sig in self.roots.scan(scanned).items()
            if self.borrowed.get(rel) != sig and (rel in current or rel not in before)
        }
        previous = dict(self.settled.published)
        self.settled.update(
            self.known, current, after, scanned=scanned, started=started,
            ended_cleanly=self.ended_cleanly and self.last_pass, changed_at=self._listed_at,
        )  # fmt: skip
        published = self.settled.published
        if self.last_pass and self.settled.unsettled:
            for unit, why in sorted(self.settled.unsettled.items()):
                self.log(
                    f"working directory: {shown(unit)} is kept as it was before ({why}): "
                    "a relaunch restores it so, or not at all"
                )
        return [rel for rel in {*previous, *published} if previous.get(rel) != published.get(rel)]

    def _listed_at(self, folder: str) -> float | None:
        """When the entries of the state folder 'root/dir' last changed (None: gone)."""
        root, _, inner = folder.partition("/")
        try:
            return os.stat(self.roots.dirs[root] / inner).st_mtime
        except (OSError, KeyError):
            return None

    def _manifest(self) -> dict[str, Any]:
        """`files`: what a relaunch restores (the settled state); `pending`: the newer
        copies stored meanwhile (their keys, for whoever cleans up after this node);
        `writing`: the files the newest pass caught being written (no copy stored)."""

        def entry(sig: Signature, key: str) -> dict[str, Any]:
            return {"key": key, "size": sig[0], "mtime_ns": sig[1]}

        published = self.settled.published
        return {
            "node": self.rank,
            "attempt": self.attempt,
            "time": time.time(),
            "files": {rel: entry(*published[rel]) for rel in sorted(published)},
            "pending": {
                rel: entry(sig, key)
                for rel, (sig, key) in sorted(self.known.items())
                if published.get(rel) != (sig, key)
            },
            "writing": sorted(self.writing),
        }

    def _freeze(
        self, paths: dict[str, Path | None], current: dict[str, Signature]
    ) -> dict[str, Path]:
        """What each changed file goes up from: the file itself, or for a moving one a
        frozen copy in the staging directory (its signature then replaces the scan's in
        `current`). A moving file whose copy caught it being written waits for the next
        pass (its stored copy stays); a copy that fails for lack of room goes up in place."""
        sources: dict[str, Path] = {}
        for index, (rel, path) in enumerate(paths.items()):
            if path is None:
                continue
            if rel not in self.moving or self.staging is None:
                sources[rel] = path
                continue
            copy = self.staging / f"{index}-{path.name}"
            try:
                root = next((d for d in self.roots.dirs.values() if path.is_relative_to(d)), None)
                sig = frozen_copy(path, copy, root)
            except OSError as exc:  # no room for the copy: in place, as before
                self.log(f"working directory: no frozen copy of {shown(rel)} ({exc})")
                sources[rel] = path
                continue
            if sig is not None:
                sources[rel] = copy
                current[rel] = sig
                self.frozen += 1
        return sources

    def _thaw(self) -> None:
        """Remove the frozen copies of a pass."""
        if self.staging is not None and self.staging.is_dir():
            for copy in self.staging.iterdir():
                copy.unlink(missing_ok=True)

    def close(self, *, outputs: bool = True, ended_cleanly: bool = False) -> None:
        """The last pass. `outputs=False` (the node succeeded: its model and output data go
        up packed) copies the working directory alone, not the same bytes twice.
        `ended_cleanly`: the script ended by itself (see node.settled)."""
        self.ended_cleanly = ended_cleanly
        self.halt()
        roots = None if outputs else [r for r in self.roots.dirs if r not in PACKED_ROOTS]
        with self._lock:
            self.sync_once(roots)

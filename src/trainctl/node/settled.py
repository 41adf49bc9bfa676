"""Which of a node's stored working-directory files a relaunch may restore: a state its files
were in together, never a folder caught half-written.

A script saves some state as several files: a Hugging Face Trainer writes `checkpoint-500/`
file by file with `trainer_state.json` last, torch.distributed.checkpoint (DCP) writes a
step folder's shards and then `.metadata`, a script may write a multi-file checkpoint in a
background thread. A sync pass that catches such a folder between two of its files, or a
last pass after a kill cut it short, must not become what the next attempt restores: the
Trainer resumes from the newest `checkpoint-*` folder and fails on the missing file.

So a node's manifest names two states: `pending`, the newest copy of every file (stored, for
the node's own bookkeeping), and `files`, what a relaunch restores: each *unit* as of the
newest pass at which it was settled.

- A file directly in a root (the working directory, SM_MODEL_DIR, SM_OUTPUT_DATA_DIR) is a
  unit of its own, as is a file in a folder whose format says where it ends (a torch.save
  zip, safetensors, a pickle: node.sync.unfinished keeps a torn one out). `snapshot.pt`
  rewritten every epoch, Lightning's `checkpoints/last.ckpt`: each copy goes as it is whole.
- A folder that is a known multi-file checkpoint is one unit, settled only when its last
  file is there: `checkpoint-<n>/` (or any folder with `trainer_state.json`) needs
  `trainer_state.json`; a DCP folder (rank 0's `__0_*.distcp`) needs `.metadata`. Another
  node's part of one (a Trainer rank's `rng_state_<rank>.pth`, a DCP rank's shard) cannot
  tell: the restore, where the nodes' parts meet, leaves out a folder still without its last
  file (incomplete_folders; the checkpoint directory's restore too).
- The other files of a folder are one unit (their format says nothing of their end), settled
  once none of them, nor the folder's list of entries, has changed for QUIET_SECONDS: a
  writer between two files is not caught. (Not the whole node's state: a log written every
  step would then keep `snapshot.pt` from ever settling.)

Known limit: a writer of plain files that pauses longer than QUIET_SECONDS between two files
of one folder is taken to be done (writing under a `.tmp` name and renaming is exact).

For a folder's unit, nothing of it may change during the pass (its files scanned before and
after the uploads agree), and every file of it must have gone up in its current version.
A unit not settled stays as it was last settled (its stored files kept for that), or absent.
After the script's own end (exit 0, or its end after a preemption notice) the age rule is
waived: what it left is what it meant to leave.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from pathlib import PurePosixPath

from trainctl.node.sync import SAVED_STATE_SUFFIXES, Signature

# A folder's files that say nothing of where they end are settled after this long unchanged.
QUIET_SECONDS = 2.0
# Formats whose end is checked (node.sync.unfinished): each such file a unit of its own.
SELF_CHECKED = frozenset(SAVED_STATE_SUFFIXES - {".npy", ".joblib", ".h5"})
HF_CHECKPOINT = re.compile(r"checkpoint-\d+")
HF_LAST = "trainer_state.json"
HF_RANK_RNG = re.compile(r"rng_state_\d+\.pth")  # each rank's own, in rank 0's folder's name
DCP_LAST = ".metadata"

Entry = tuple[Signature, str]  # (local signature, store key), as WorkdirSync.known


def unit_of(rel: str, siblings: Callable[[str], Iterable[str]]) -> str:
    """The unit of the state path 'root/dir/.../file': the path itself, or its folder
    ('root/dir/' ) for a file that is part of a multi-file checkpoint or a folder's
    unchecked files. `siblings(folder)` names the files now known in that folder."""
    folder, _, name = rel.rpartition("/")
    if "/" not in folder:  # directly in a root
        return rel
    kind = folder_kind(folder, siblings(folder))
    if kind is not None or PurePosixPath(name).suffix.lower() not in SELF_CHECKED:
        return folder + "/"
    return rel


def folder_kind(folder: str, names: Iterable[str]) -> str | None:
    """'hf' or 'dcp' for a folder that is a known multi-file checkpoint as the node that
    writes its last file sees it, else None. (Another node's part of one, a Trainer rank's
    `rng_state_<rank>.pth` or a DCP rank's shard, is checked once the nodes' parts meet:
    see incomplete_folders.)"""
    listed = set(names)
    named = HF_CHECKPOINT.fullmatch(folder.rsplit("/", 1)[-1]) is not None
    if (named or HF_LAST in listed) and any(not HF_RANK_RNG.fullmatch(n) for n in listed):
        return "hf"
    if DCP_LAST in listed or any(n.startswith("__0_") and n.endswith(".distcp") for n in listed):
        return "dcp"
    return None


def missing_last_file(folder: str, names: Iterable[str]) -> str | None:
    """The file a known multi-file checkpoint folder writes last, when it is not there."""
    listed = set(names)
    last = {"hf": HF_LAST, "dcp": DCP_LAST}.get(folder_kind(folder, listed) or "")
    return last if last is not None and last not in listed else None


def incomplete_folders(paths: Iterable[str]) -> dict[str, str]:
    """Of the state paths every node's restore brings together, each folder that is a
    Trainer checkpoint (`checkpoint-<n>/`) without `trainer_state.json` or holds DCP shards
    without `.metadata`: folder -> the file it lacks. Restoring such a folder would have the
    script resume from a checkpoint that is not there."""
    folders: dict[str, set[str]] = {}
    for rel in paths:
        folder, _, name = rel.rpartition("/")
        if "/" in folder:
            folders.setdefault(folder, set()).add(name)
    found: dict[str, str] = {}
    for folder, names in folders.items():
        if HF_CHECKPOINT.fullmatch(folder.rsplit("/", 1)[-1]) and HF_LAST not in names:
            found[folder] = HF_LAST
        elif any(n.endswith(".distcp") for n in names) and DCP_LAST not in names:
            found[folder] = DCP_LAST
    return found


class Settled:
    """The state a relaunch restores, kept up to date pass by pass (see the module's doc).

    `published`: 'root/path' -> (signature, key) of each file as of its unit's newest
    settled pass. `update()` after each pass; `referenced()` the keys it still needs."""

    def __init__(self, published: dict[str, Entry] | None = None) -> None:
        self.published: dict[str, Entry] = dict(published or {})
        # units left as before at the last pass: 'root/dir/' or 'root/file' -> why
        self.unsettled: dict[str, str] = {}

    def update(
        self,
        known: dict[str, Entry],
        before: dict[str, Signature],
        after: dict[str, Signature],
        *,
        scanned: Iterable[str],
        started: float,
        ended_cleanly: bool,
        changed_at: Callable[[str], float | None],
    ) -> None:
        """After a pass over the roots `scanned`: `known` the newest stored copy of each file,
        `before`/`after` the scans around its uploads (files kept, others' copies left out),
        `started` its start (wall clock), `changed_at(folder)` when a folder's list of
        entries last changed (None: gone)."""
        roots = tuple(scanned)
        in_scope = {rel for rel in {*known, *self.published} if rel.split("/", 1)[0] in roots}
        by_folder: dict[str, set[str]] = {}
        for rel in {*in_scope, *after}:
            by_folder.setdefault(rel.rpartition("/")[0], set()).add(rel.rpartition("/")[2])
        units: dict[str, set[str]] = {}
        for rel in in_scope | set(after):
            unit = unit_of(rel, lambda folder: by_folder.get(folder, ()))
            units.setdefault(unit, set()).add(rel)
        self.unsettled = {}
        for unit, rels in units.items():
            newest = {rel: known[rel] for rel in rels if rel in known}
            if newest == {rel: self.published[rel] for rel in rels if rel in self.published}:
                continue
            why = self._why_not(unit, rels, known, before, after, started, ended_cleanly,
                                changed_at)  # fmt: skip
            if why is not None:
                self.unsettled[unit] = why
                continue
            for rel in rels:
                if rel in known:
                    self.published[rel] = known[rel]
                else:
                    self.published.pop(rel, None)

    def _why_not(
        self,
        unit: str,
        rels: set[str],
        known: dict[str, Entry],
        before: dict[str, Signature],
        after: dict[str, Signature],
        started: float,
        ended_cleanly: bool,
        changed_at: Callable[[str], float | None],
    ) -> str | None:
        """Why `unit` is not settled at this pass (None: it is)."""
        if not unit.endswith("/"):
            return None  # one file: the sync stores only whole, untorn copies of it
        now = {rel: sig for rel, sig in after.items() if rel in rels}
        if now != {rel: sig for rel, sig in before.items() if rel in rels}:
            return "written to while it was copied"
        if any(known.get(rel, (None,))[0] != sig for rel, sig in now.items()):
            return "not all of it stored in its current version"
        folder = unit[:-1]
        names = [rel.rpartition("/")[2] for rel in now]
        if folder_kind(folder, names) is not None:
            last = missing_last_file(folder, names)
            return f"without its {last}, which is written last" if last and now else None
        if ended_cleanly:
            return None
        times = [sig[1] / 1e9 for sig in now.values()]
        listed = changed_at(folder)
        newest = max([*times, *([listed] if listed is not None else [])], default=0.0)
        if newest > started - QUIET_SECONDS:
            return f"written to in the {QUIET_SECONDS:g} s before the pass"
        return None

    def referenced(self) -> set[str]:
        return {key for _, key in self.published.values()}

"""What each node of an attempt put back before its script started, and what follows: the
record's per-node restore, a split resume caught before it hangs, and a relaunch that
starts from scratch.

Every node restores every node's working-directory files (the newest copy of each) and the
union of the checkpoint directories, so the nodes of an attempt normally start from the
same state. When they do not (a copy pruned while a node fetched it, a node whose store
reads failed, a cap), the ranks resume from different points: DDP then hangs in a
collective or fails with an error that blames a peer. Said once, naming the nodes and what
each had, before that happens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainctl.record.models import STATE_FILES_RECORDED, Attempt, NodeRestored, Restored, StateCopy

# A relaunch that restores nothing after an attempt that trained this long (or reported a
# step) starts over: worth a warning.
FROM_SCRATCH_WARNING_SECONDS = 30.0
# Paths named in a split resume's warning (the rest are counted).
SPLIT_PATHS_NAMED = 3


def newest_state(state: dict[str, Any], limit: int) -> dict[str, Any]:
    """The `limit` newest entries of a saved-state map (path -> copy with `written_ms`)."""

    def written(item: tuple[str, Any]) -> int:
        value = item[1].get("written_ms") if isinstance(item[1], dict) else None
        return value if isinstance(value, int) else 0

    return dict(sorted(state.items(), key=lambda i: (-written(i), i[0]))[:limit])


class AttemptRestores:
    """The nodes' `restored` reports of one attempt: into its record (each node's, with its
    newest saved-state files), and whole here, for the comparison once every node has said."""

    def __init__(self, attempt: Attempt) -> None:
        self.attempt = attempt
        self.full: dict[int, NodeRestored] = {}

    def add(self, msg: dict[str, Any]) -> None:
        node = NodeRestored.from_message(msg)
        self.full[node.rank] = node
        recorded = node.model_copy(update={"state": newest_state(node.state, STATE_FILES_RECORDED)})
        self.attempt.restored = self.attempt.restored or Restored()
        self.attempt.restored.add(recorded)

    def split(self) -> str | None:
        """Whether the nodes that reported start from different state, in words (None: the
        same). Recorded in the attempt's restore once found."""
        found = split_resume(list(self.full.values()))
        if found and self.attempt.restored is not None:
            self.attempt.restored.split = found
        return found

    def warnings(self, attempts: list[Attempt]) -> list[Said]:
        """Once every node has said what it restored: a split resume (the nodes start from
        different state), a relaunch that starts from scratch."""
        said = []
        number = self.attempt.number
        if split := self.split():
            said.append(
                Said(
                    "split_resume",
                    {"differences": split},
                    f"attempt {number}'s nodes start from different state (their ranks would "
                    f"resume at different points, and hang or fail): {split}",
                )
            )
        if unsettled := sorted({p for n in self.full.values() for p in n.unsettled}):
            named = ", ".join(unsettled[:SPLIT_PATHS_NAMED])
            more = f" and {len(unsettled) - SPLIT_PATHS_NAMED} more" * (
                len(unsettled) > SPLIT_PATHS_NAMED
            )
            said.append(
                Said(
                    "restored_as_before",
                    {"paths": unsettled},
                    f"attempt {number}: {named}{more} was being written when attempt "
                    f"{number - 1} ended: restored as it was before, or not at all (never half)",
                )
            )
        if lost := from_scratch(attempts, self.attempt):
            said.append(
                Said(
                    "from_scratch",
                    {"lost": lost},
                    f"attempt {number} starts from scratch: nothing to restore after attempt "
                    f"{number - 1} reached {lost}. Save state in the working directory or "
                    "SM_CHECKPOINT_DIR (trainctl.train.Checkpointer) to resume from it",
                )
            )
        return said


@dataclass(frozen=True)
class Said:
    """A warning of the controller's: its event (type and fields) and its words."""

    event: str
    fields: dict[str, Any] = field(default_factory=dict)
    text: str = ""


def split_resume(nodes: list[NodeRestored]) -> str | None:
    """What differs between the nodes' restores: each saved-state file that some node put
    back in another version than another node, or not at all; then the checkpoint directory
    and the working directory as a whole. None when every node has the same (or only one
    node reported)."""
    if len(nodes) < 2:
        return None
    nodes = sorted(nodes, key=lambda n: n.rank)
    differences: list[str] = []
    for path in sorted({p for n in nodes for p in n.state}):
        versions: dict[tuple | None, tuple[StateCopy | None, list[int]]] = {}
        for node in nodes:
            copy = node.state.get(path)
            key = None if copy is None else tuple(copy.model_dump().values())
            versions.setdefault(key, (copy, []))[1].append(node.rank)
        if len(versions) > 1:
            differences.append(f"{path}: {_who_has(list(versions.values()))}")
    named = differences[:SPLIT_PATHS_NAMED]
    if len(differences) > SPLIT_PATHS_NAMED:
        named.append(f"and {len(differences) - SPLIT_PATHS_NAMED} more file(s)")
    checkpoints = {(n.checkpoint_files, n.checkpoint_bytes) for n in nodes}
    if len(checkpoints) > 1:
        named.append(
            "the checkpoint directory: "
            + "; ".join(f"algo-{n.rank + 1} {n.checkpoint_files} file(s)" for n in nodes)
        )
    if not differences and len({(n.files, n.bytes) for n in nodes}) > 1:
        named.append(
            "the working directory: " + "; ".join(f"algo-{n.rank + 1} {n.text()}" for n in nodes)
        )
    return " · ".join(named) or None


def _who_has(versions: list[tuple[StateCopy | None, list[int]]]) -> str:
    """'algo-1 restored attempt 1, algo-1's copy of 12:00:03, 1.2 MB; algo-2 restored
    nothing'."""
    parts = []
    for copy, ranks in sorted(versions, key=lambda v: min(v[1])):
        hosts = ", ".join(f"algo-{r + 1}" for r in sorted(ranks))
        parts.append(f"{hosts} restored {'nothing' if copy is None else copy.text()}")
    return "; ".join(parts)


def from_scratch(record_attempts: list[Attempt], attempt: Attempt) -> str | None:
    """What a relaunch whose nodes found nothing to restore starts over from ('step 40',
    '95 s of training'), after an attempt that trained a while; None otherwise."""
    if attempt.number < 2 or not attempt.restored_nothing():
        return None
    before = record_attempts[attempt.number - 2]
    trained = before.training_seconds or 0.0
    if not before.last_step and trained < FROM_SCRATCH_WARNING_SECONDS:
        return None
    return f"step {before.last_step}" if before.last_step else f"{trained:.0f} s of training"

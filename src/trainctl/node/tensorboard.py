"""A node's TensorBoard logs, copied to the job's TensorBoard location while it runs.

What a script writes under the node's TensorBoard directory (SageMaker's
container_local_output_path, /opt/ml/output/tensorboard by default; TRAINCTL_TENSORBOARD_DIR)
goes to `tensorboard_s3_uri` (default jobs/<job>/tensorboard/), so that `trainctl
tensorboard` shows a running job's scalars and an ended job's stay. Upload only: event files
only grow, a new attempt's writers make new files beside the old ones (TensorBoard reads them
as one run), and nothing is ever restored or deleted. Rank 0's files keep their paths; another
node's go under `node-<rank>/`, so that two nodes' writers never replace each other's file
(local nodes share a host name, and Lightning names its version directory per node).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from trainctl.node.checkpoints import scan
from trainctl.node.sync import PeriodicSync, Signature, upload_present
from trainctl.store import Store


def node_prefix(rank: int) -> str:
    """Where node `rank`'s files go under the job's TensorBoard location."""
    return "" if rank == 0 else f"node-{rank}/"


class TensorBoardSync(PeriodicSync):
    """Every `interval` seconds, the files of `local` that are new or changed since their
    last upload go up (a file being appended is copied as far as it is written; the next
    pass takes the rest)."""

    name = "tensorboard sync"

    def __init__(
        self, store: Store, local: Path, rank: int, *, interval: float, log: Callable[[str], None]
    ) -> None:
        super().__init__(interval=interval, log=log)
        self.store = store
        self.local = local
        self.prefix = node_prefix(rank)
        self.uploaded: dict[str, Signature] = {}

    def sync_once(self) -> int:
        current = scan(self.local)
        changed = sorted(rel for rel, sig in current.items() if self.uploaded.get(rel) != sig)
        done = upload_present(
            self.store,
            [(self.prefix + rel, self.local / rel) for rel in changed],
            workers=4,
            roots=[self.local],
        )
        for rel in changed:
            if self.prefix + rel in done:
                self.uploaded[rel] = current[rel]
        return len(done)

"""A hung attempt, named within minutes: how long a relaunch may go without progress (the
job's own pace), and the failure that says where each rank waits.

A relaunch that stops making progress (ranks that resumed from different points, waiting in
a collective while a peer ended or sits in another one) would otherwise wait out
`progress_timeout_seconds` (30 minutes by default). Its earlier attempts showed how the job
progresses: the longest quiet stretch between two signs of progress (a step, a new line;
controller.progress_watch) of any of them, `hang_pace_factor` times, never under
`hang_floor_seconds`, plus the time to load what its nodes restored, bounds it. When it
runs out, each node's agent writes every rank's Python stack to its log (faulthandler, in
the rank: node.ranks) and says where the rank waits; the failure names them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainctl.controller.progress_watch import ProgressWatch
from trainctl.record.models import Attempt, JobRecord

# What a node reads back of what it restored, per second, as the bound allows it (a torch.load
# of a large checkpoint is slower than its download; a conservative rate).
LOAD_BYTES_PER_SECOND = 100 * 2**20
# How long the nodes get to send their ranks' stacks before they are stopped anyway.
STACKS_GRACE_SECONDS = 5.0


@dataclass(frozen=True)
class PaceBound:
    """A relaunch's bound from the earlier attempts: `pace` is their longest quiet stretch."""

    pace: float
    factor: float
    floor: float

    def seconds(self, attempt: Attempt) -> float:
        restored = (
            attempt.restored.bytes + attempt.restored.checkpoint_bytes if attempt.restored else 0
        )
        return max(self.floor, self.factor * self.pace) + restored / LOAD_BYTES_PER_SECOND

    def reason(self, attempt: Attempt) -> str:
        return (
            f"bound {self.seconds(attempt):.0f} s: {self.factor:g}x the longest quiet stretch of "
            f"the earlier attempts, {self.pace:.0f} s, at least {self.floor:.0f} s"
        )


def pace_bound(record: JobRecord, factor: float, floor: float) -> PaceBound | None:
    """The bound for the job's next attempt, from the attempts before it; None for a first
    attempt, when no earlier attempt trained, or with `factor` 0 (the timeouts alone)."""
    quiet = [a.longest_quiet_seconds for a in record.attempts[:-1] if a.longest_quiet_seconds]
    if not quiet or factor <= 0:
        return None
    return PaceBound(max(quiet), factor, floor)


def update_pace(progress: ProgressWatch, pace: PaceBound | None, attempt: Attempt) -> None:
    """The attempt's longest quiet stretch so far into its record (what the next attempts'
    bound is made of), and its own bound from the earlier attempts' into its watch."""
    if progress.longest_quiet is not None:
        attempt.longest_quiet_seconds = round(progress.longest_quiet, 1)
    if pace is not None:
        progress.pace_bound = pace.seconds(attempt)
        progress.pace_reason = pace.reason(attempt)


def hung_failure(
    hang: str, nodes: dict[int, Any], stacks: dict[int, dict[str, str]]
) -> tuple[str, str | None]:
    """The failure of a hung attempt: the hang, then where each rank waits (from the nodes'
    stacks) and which nodes had ended; the detail lists every rank."""
    said: list[str] = []
    for rank in sorted(nodes):
        node = nodes[rank]
        host = f"algo-{rank + 1}"
        for worker, where in sorted(stacks.get(rank, {}).items(), key=lambda i: _order(i[0])):
            said.append(f"{host} rank {worker} in {where}")
        if rank not in stacks and node.exit_code is not None and not node.lost:
            said.append(f"{host} had ended (exit code {node.exit_code})")
    if not said:
        return hang, None
    detail = "\n".join(said)
    waiting = [line for line in said if " in " in line]
    ended = [line for line in said if "had ended" in line]
    return f"{hang}; {'; '.join([*waiting[:2], *ended[:2]])}", detail


def _order(worker: str) -> tuple[int, str]:
    return (int(worker), "") if worker.isdigit() else (1 << 30, worker)

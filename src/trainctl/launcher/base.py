"""What every launcher returns: one node's command and the environment it adds."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class NodeCommand:
    argv: list[str]  # empty: this node runs nothing itself (an MPI worker host)
    env: dict[str, str] = field(default_factory=dict)  # on top of the SM_* environment
    # mpirun's output: its processes' on stdout, each piece tagged with the process's rank
    # (`[1,R]<stdout>:`), its own reports on stderr; read apart, so that a report never
    # shares a line with a piece of a process's line (node.output.RankedLines).
    mpirun_output: bool = False

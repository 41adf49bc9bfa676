"""From (spec, cluster, node rank) to the exact command and environment of one node.

One module per launcher; everything here is a pure function so tests and dry runs can show
precisely what a node will execute.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainctl.cluster import ClusterInfo
from trainctl.estimator.spec import JobSpec


@dataclass(frozen=True)
class NodeCommand:
    argv: list[str]  # empty: this node runs nothing itself (an MPI worker host)
    env: dict[str, str] = field(default_factory=dict)  # on top of the SM_* environment


def build_node_command(
    spec: JobSpec, cluster: ClusterInfo, rank: int, *, python: str
) -> NodeCommand:
    from trainctl.launcher import mpi, plain, torchrun

    builders = {"torchrun": torchrun.command, "mpi": mpi.command, "python": plain.command}
    return builders[spec.launcher](spec, cluster, rank, python=python)

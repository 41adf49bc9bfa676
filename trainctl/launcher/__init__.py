"""From (spec, cluster, node rank) to the exact command and environment of one node.

One module per launcher; everything here is a pure function so tests and dry runs can show
precisely what a node will execute.
"""

from __future__ import annotations

from trainctl.cluster import ClusterInfo
from trainctl.launcher.base import NodeCommand
from trainctl.spec.job import JobSpec

__all__ = ["NodeCommand", "build_node_command"]


def build_node_command(
    spec: JobSpec, cluster: ClusterInfo, rank: int, *, python: str
) -> NodeCommand:
    from trainctl.launcher import mpi, plain, torchrun

    builders = {"torchrun": torchrun.command, "mpi": mpi.command, "python": plain.command}
    return builders[spec.launcher](spec, cluster, rank, python=python)

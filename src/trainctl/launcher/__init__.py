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
    spec: JobSpec, cluster: ClusterInfo, rank: int, *, python: str, agent_python: str | None = None
) -> NodeCommand:
    """Node `rank`'s command; `python`: the job's interpreter there, `agent_python`: the
    node agent's (mpirun's remote shell runs on it; the job's by default)."""
    from trainctl.launcher import mpi, plain, torchrun

    if spec.launcher == "mpi":
        return mpi.command(spec, cluster, rank, python=python, agent_python=agent_python)
    builders = {"torchrun": torchrun.command, "python": plain.command}
    return builders[spec.launcher](spec, cluster, rank, python=python)

"""No distribution: the entry point once per host under plain `python` (SageMaker semantics),
or the job's container_entry_point and container_arguments as SageMaker runs them in place
of its training toolkit (`python`/`python3` as their first word: the node's Python).

Scripts that start their own process groups read SM_HOSTS / SM_CURRENT_HOST; the torch
`env://` variables are set too so `init_process_group()` works with one process per host.
"""

from __future__ import annotations

from trainctl.cluster import ClusterInfo
from trainctl.launcher.base import NodeCommand
from trainctl.launcher.layout import entry_argv
from trainctl.spec.job import JobSpec


def command(spec: JobSpec, cluster: ClusterInfo, rank: int, *, python: str) -> NodeCommand:
    env = {
        "MASTER_ADDR": cluster.master.address,
        "MASTER_PORT": str(cluster.master_port),
        "RANK": str(rank),
        "LOCAL_RANK": "0",
        "WORLD_SIZE": str(len(cluster.nodes)),
        "LOCAL_WORLD_SIZE": "1",
    }
    if spec.container_entry_point:  # SageMaker's: the command as given (python: the node's)
        first, *rest = spec.container_entry_point
        program = python if first in ("python", "python3") else first
        return NodeCommand([program, *rest, *spec.container_arguments], env)
    return NodeCommand([python, *entry_argv(spec)], env)

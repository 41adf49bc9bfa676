"""`mpirun` from the first node across all hosts (SageMaker's MPI semantics).

Only rank 0 launches; the other hosts run nothing themselves and are reached by mpirun.
Hosts that share an address (the local provider) are merged into one host entry, so the
processes run there without a remote shell.
"""

from __future__ import annotations

import shlex

from trainctl.cluster import ClusterInfo
from trainctl.launcher.base import NodeCommand
from trainctl.launcher.layout import script_args
from trainctl.launcher.threads import processes_per_node
from trainctl.spec.job import JobSpec


def command(spec: JobSpec, cluster: ClusterInfo, rank: int, *, python: str) -> NodeCommand:
    if rank != 0:
        return NodeCommand([])
    mpi = spec.distribution.mpi if spec.distribution else None
    per_host = processes_per_node(spec, cluster)
    slots: dict[str, int] = {}
    for node in cluster.nodes:
        slots[node.address] = slots.get(node.address, 0) + per_host
    total = per_host * len(cluster.nodes)
    # (No --tag-output of trainctl's: mpirun forwards pieces of lines, and a piece of a rank's
    # line and mpirun's own untagged report can share an output line, which no reader can
    # split again; the failure reason then named the report's last line.)
    custom = shlex.split(mpi.custom_mpi_options if mpi else "")
    argv = [
        "mpirun",
        "--allow-run-as-root",
        "--host",
        ",".join(f"{addr}:{n}" for addr, n in slots.items()),
        "-np",
        str(total),
        "--bind-to",
        "none",
        "-x",
        "PATH",
        "-x",
        "PYTHONUNBUFFERED",
        "-x",
        "MASTER_ADDR",
        "-x",
        "MASTER_PORT",
        *custom,
        python,
        spec.entry_point,
        *script_args(spec),
    ]
    env = {"MASTER_ADDR": cluster.master.address, "MASTER_PORT": str(cluster.master_port)}
    return NodeCommand(argv, env)

"""How many CPU threads each training process of a node uses when processes share a machine.

PyTorch's CPU kernels start one OpenMP thread per core in every process, and idle OpenMP
threads spin before they sleep. Several training processes on one machine (torchrun's
`--nproc-per-node`, or the local provider's nodes, which all run here) then each start a
thread per core and spin against each other: the cores are oversubscribed, and CPU time
goes to waiting. torchrun answers with `OMP_NUM_THREADS=1` for every worker when it starts
more than one; trainctl gives each process its share of the cores instead (at least one),
counting every training process on the machine, not only the node's own. One process alone
on its machine keeps PyTorch's default (every core). A value the user set (in the
environment the node inherits, or the job's `environment`) wins.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from trainctl.cluster import ClusterInfo, is_loopback
from trainctl.spec.job import JobSpec

THREADS_VARIABLE = "OMP_NUM_THREADS"


def processes_per_node(spec: JobSpec, cluster: ClusterInfo) -> int:
    """The training processes one node runs: torchrun's and mpirun's per-host count, one
    under plain python (SageMaker's semantics without a distribution)."""
    if spec.launcher == "python":
        return 1
    mpi = spec.distribution.mpi if spec.distribution else None
    if spec.launcher == "mpi" and mpi and mpi.processes_per_host:
        return mpi.processes_per_host
    return cluster.processes_per_host


def nodes_on_this_machine(cluster: ClusterInfo, rank: int) -> int:
    """How many of the job's nodes share node `rank`'s machine: every node at a loopback
    address when this one is (the local provider, SSH hosts on this machine), else those at
    its own address (a host listed twice)."""
    here = cluster.node(rank).address
    if is_loopback(here):
        return sum(is_loopback(node.address) for node in cluster.nodes)
    return sum(node.address == here for node in cluster.nodes)


def thread_env(
    spec: JobSpec, cluster: ClusterInfo, rank: int, *, cpus: int, inherited: Mapping[str, str]
) -> dict[str, str]:
    """{OMP_NUM_THREADS: each process's share of the `cpus` cores} when more than one
    training process runs on node `rank`'s machine and the user set no value; else {}."""
    if THREADS_VARIABLE in inherited or THREADS_VARIABLE in spec.environment:
        return {}
    processes = nodes_on_this_machine(cluster, rank) * processes_per_node(spec, cluster)
    if processes <= 1:
        return {}
    return {THREADS_VARIABLE: str(max(1, cpus // processes))}


def usable_cpus() -> int:
    """The cores this process may run on (a container's or taskset's share, not the host's)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1

"""`torchrun` on every node with a static rendezvous at rank 0's address.

Run through `trainctl.launcher.torchrun_main`, which is torchrun itself after non-master
nodes have waited for the master's store to listen (no connection-refused backoff).

`--max-restarts 0`: when a node is lost the controller restarts the whole cluster from the
latest checkpoint; torchrun restarting workers in place would hide that decision.
"""

from __future__ import annotations

from trainctl.cluster import ClusterInfo
from trainctl.launcher.base import NodeCommand
from trainctl.launcher.layout import hyperparameter_args
from trainctl.spec.job import JobSpec


def command(spec: JobSpec, cluster: ClusterInfo, rank: int, *, python: str) -> NodeCommand:
    argv = [
        python,
        "-m",
        "trainctl.launcher.torchrun_main",
        "--nnodes",
        str(len(cluster.nodes)),
        "--node-rank",
        str(rank),
        "--nproc-per-node",
        str(cluster.processes_per_host),
        "--master-addr",
        cluster.master.address,
        "--master-port",
        str(cluster.master_port),
        "--max-restarts",
        "0",
        spec.entry_point,
        *hyperparameter_args(spec.hyperparameters),
    ]
    # torchrun sets RANK/LOCAL_RANK/WORLD_SIZE per worker; MASTER_* here are for tools
    # that read them in the launcher's own environment.
    env = {"MASTER_ADDR": cluster.master.address, "MASTER_PORT": str(cluster.master_port)}
    return NodeCommand(argv, env)

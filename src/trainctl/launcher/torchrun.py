"""`torchrun` on every node with a static rendezvous at rank 0's address.

Run through `trainctl.launcher.torchrun_main`, which is torchrun itself after non-master
nodes have waited for the master's store to listen (no connection-refused backoff).

`--max-restarts 0`: when a node is lost the controller restarts the whole cluster from the
latest checkpoint; torchrun restarting workers in place would hide that decision.
"""

from __future__ import annotations

from trainctl.cluster import ClusterInfo
from trainctl.launcher.base import NodeCommand
from trainctl.launcher.layout import entry_argv
from trainctl.protocol import TORCHRUN_PREFIX_TEMPLATE
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
        *entry_argv(spec, module_flag="--module"),
    ]
    # torchrun sets RANK/LOCAL_RANK/WORLD_SIZE per worker; MASTER_* here are for tools
    # that read them in the launcher's own environment.
    env = {"MASTER_ADDR": cluster.master.address, "MASTER_PORT": str(cluster.master_port)}
    if cluster.processes_per_host > 1:
        # Each worker's output tagged with its rank, so the node log tells them apart
        # (reassembled by node.output.RankedLines).
        argv[argv.index("--max-restarts") : argv.index("--max-restarts")] = ["--tee", "3"]
        env["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] = TORCHRUN_PREFIX_TEMPLATE
    return NodeCommand(argv, env)

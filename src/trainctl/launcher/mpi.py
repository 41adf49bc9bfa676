"""`mpirun` from the first node across all hosts (SageMaker's MPI semantics).

Only rank 0 launches; the other hosts run nothing themselves and are reached by mpirun.
Hosts that share an address (the local provider) are merged into one host entry, so the
processes run there without a remote shell. Across hosts at different addresses mpirun's
remote shell is trainctl's own (trainctl.node.remote_start): each node's agent starts
Open MPI's daemon there, under that node's environment, so no SSH is set up between nodes.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from trainctl.cluster import ClusterInfo
from trainctl.launcher.base import NodeCommand
from trainctl.launcher.layout import Layout, entry_argv
from trainctl.launcher.threads import processes_per_node
from trainctl.spec.job import JobSpec

REMOTE_START_MODULE = "trainctl.node.remote_start"
JOB_PYTHON_VARIABLE = "TRAINCTL_JOB_PYTHON"
CODE_DIR_VARIABLE = "TRAINCTL_CODE_DIR"
# Each host's processes start in its own code directory with its own job interpreter (the
# hosts' may be at other paths: an SSH host's home and `python`, a per-host requirements
# environment), named by the environment the node's agent gives Open MPI's daemon there.
# (mpirun would start them in its own directory, a path of the first host's.) `exec`
# leaves no shell in between. A process's errors go with its output, so that they arrive
# tagged and in order with it (mpirun's stderr is left to its own reports).
_ON_EACH_HOST = [
    "/bin/sh",
    "-c",
    f'cd "${CODE_DIR_VARIABLE}" && exec "${JOB_PYTHON_VARIABLE}" "$@" 2>&1',
    "python",
]


def starts_remotely(cluster: ClusterInfo) -> bool:
    """Whether mpirun starts processes on other hosts (through trainctl's remote shell)."""
    return len({node.address for node in cluster.nodes}) > 1


def command(
    spec: JobSpec,
    cluster: ClusterInfo,
    rank: int,
    *,
    python: str,
    agent_python: str | None = None,
) -> NodeCommand:
    """Rank 0's mpirun (`agent_python`: the interpreter of the node's agent, which runs the
    remote shell; the job's `python` by default)."""
    if rank != 0:
        return NodeCommand([])
    mpi = spec.distribution.mpi if spec.distribution else None
    per_host = processes_per_node(spec, cluster)
    slots: dict[str, int] = {}
    for node in cluster.nodes:
        slots[node.address] = slots.get(node.address, 0) + per_host
    total = per_host * len(cluster.nodes)
    # mpirun forwards pieces of its processes' output as they come: untagged, two processes'
    # lines shared output lines ("SUM 1 3SUM 0 3"); tagged, each piece says its rank and the
    # agent joins each process's pieces again (NodeCommand.mpirun_output).
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
        "--tag-output",
        *_interface_options(cluster, custom),
    ]
    env = daemon_env(cluster, python, Layout(Path(cluster.node(rank).root)).code.as_posix())
    if starts_remotely(cluster):
        # Open MPI splits the agent's value at spaces and finds its first word on PATH.
        # No tree spawn: only this node has the table of the others' agents.
        shell = f"{agent_python or python} -m {REMOTE_START_MODULE}"
        argv += ["--mca", "plm_rsh_agent", shell, "--mca", "plm_rsh_no_tree_spawn", "1"]
    else:
        argv += ["-x", "PATH"]
    argv += ["-x", "PYTHONUNBUFFERED", "-x", "MASTER_ADDR", "-x", "MASTER_PORT", *custom]
    program = [*_ON_EACH_HOST, *entry_argv(spec)]
    return NodeCommand([*argv, *program], env, mpirun_output=True)


def daemon_env(cluster: ClusterInfo, python: str, code_dir: str) -> dict[str, str]:
    """What a node adds for the MPI processes it hosts: the master's address (for
    `init_process_group`), its own job interpreter and code directory."""
    return {
        "MASTER_ADDR": cluster.master.address,
        "MASTER_PORT": str(cluster.master_port),
        JOB_PYTHON_VARIABLE: python,
        CODE_DIR_VARIABLE: code_dir,
    }


# NCCL's exclusion entries are name prefixes; Open MPI's are whole names: docker's bridge.
_WHOLE_NAMES = {"docker": "docker0"}


def _interface_options(cluster: ClusterInfo, custom: list[str]) -> list[str]:
    """Open MPI's own traffic (daemons, TCP messages) on the interfaces the cluster gives
    NCCL: the one it pins (`lo` on loopback clusters), or all but those it excludes (EC2:
    the loopback and docker's bridge, which has one address on every host, so a process
    that takes it for a peer's reaches itself and hangs). Not for a part whose interfaces
    the user's options choose (Open MPI refuses an include and an exclude together)."""
    nccl = cluster.network_env.get("NCCL_SOCKET_IFNAME", "")
    if not nccl:
        return []
    if nccl.startswith("^"):
        names = [_WHOLE_NAMES.get(name, name) for name in nccl[1:].split(",") if name]
        choice, value = "exclude", ",".join(names)
    else:
        choice, value = "include", nccl
    options: list[str] = []
    for part in ("oob_tcp_if_", "btl_tcp_if_"):
        if not any(part in word for word in custom):
            options += ["--mca", f"{part}{choice}", value]
    return options

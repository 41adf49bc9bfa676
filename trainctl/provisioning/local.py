"""The embedded provider: every node is a directory on this machine plus its process tree.

Nodes talk over loopback (all of 127.0.0.0/8 is local), so the gloo/NCCL interface is
pinned to `lo` and no traffic leaves the machine.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
from pathlib import Path
from typing import Any

from trainctl.cluster import ClusterInfo, NodeInfo, host_name
from trainctl.estimator.spec import JobSpec
from trainctl.provisioning.base import DEFAULT_MASTER_PORT, Provider
from trainctl.settings import get_settings
from trainctl.transport import RunningProcess
from trainctl.transport.local import LocalProcess
from trainctl.transport.procs import ATTEMPT_TAG, JOB_TAG, NODE_TAG, end_processes, job_processes

LOOPBACK = "127.0.0.1"
LOOPBACK_ENV = {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo", "TP_SOCKET_IFNAME": "lo"}


def free_port(address: str = LOOPBACK) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


class LocalProvider(Provider):
    name = "local"

    def __init__(self, home: Path | None = None) -> None:
        self.home = home or get_settings().home

    def nodes_dir(self, job: str) -> Path:
        return self.home / "nodes" / job

    def node_root(self, job: str, attempt: int, rank: int) -> Path:
        return self.nodes_dir(job) / f"attempt-{attempt}" / f"node-{rank}"

    def dry_run(self, spec: JobSpec, job: str, attempt: int) -> list[dict[str, Any]]:
        return [
            {
                "service": "local",
                "operation": "CreateNode",
                "params": {"root": str(self.node_root(job, attempt, r)), "address": LOOPBACK},
            }
            for r in range(spec.instance_count)
        ]

    def planned_cluster(self, spec: JobSpec, job: str, attempt: int) -> ClusterInfo:
        return self._cluster(spec, job, attempt, port=DEFAULT_MASTER_PORT)

    def provision(self, spec: JobSpec, job: str, attempt: int) -> ClusterInfo:
        for rank in range(spec.instance_count):
            self.node_root(job, attempt, rank).mkdir(parents=True, exist_ok=True)
        return self._cluster(spec, job, attempt, port=free_port())

    def _cluster(self, spec: JobSpec, job: str, attempt: int, *, port: int) -> ClusterInfo:
        nodes = []
        for rank in range(spec.instance_count):
            root = self.node_root(job, attempt, rank)
            nodes.append(
                NodeInfo(rank=rank, host=host_name(rank), address=LOOPBACK, root=str(root))
            )
        network_env = {k: os.environ.get(k, v) for k, v in LOOPBACK_ENV.items()}
        return ClusterInfo(
            job=job,
            attempt=attempt,
            provider=self.name,
            instance_type=spec.instance_type,
            nodes=nodes,
            master_port=port,
            processes_per_host=spec.processes_per_host or 1,
            network_env=network_env,
        )

    def agent_python(self, cluster: ClusterInfo, rank: int) -> str:
        return sys.executable

    def start_agent(
        self, cluster: ClusterInfo, rank: int, argv: list[str], env: dict[str, str]
    ) -> RunningProcess:
        tags = {JOB_TAG: cluster.job, NODE_TAG: str(rank), ATTEMPT_TAG: str(cluster.attempt)}
        full_env = {**os.environ, **env, **tags}
        full_env.pop("TRAINCTL_CONTROLLER", None)
        root = Path(cluster.node(rank).root)
        return LocalProcess(argv, full_env, cwd=root)

    def kill_node(self, cluster: ClusterInfo, rank: int) -> None:
        """SIGKILL every process of the node at once, as losing the machine would."""
        end_processes(lambda: job_processes(cluster.job, node=rank), grace=0)

    def terminate(self, job: str, *, grace: float) -> None:
        end_processes(lambda: job_processes(job), grace)
        shutil.rmtree(self.nodes_dir(job), ignore_errors=True)
        parent = self.nodes_dir(job).parent
        try:
            parent.rmdir()  # only if no other job's nodes are there
        except OSError:
            pass

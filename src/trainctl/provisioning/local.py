"""The embedded provider: every node is a directory on this machine plus its process tree.

Nodes talk over loopback (all of 127.0.0.0/8 is local), so the gloo/NCCL interface is
pinned to `lo` and no traffic leaves the machine.

On a machine with GPUs, each node gets its own share of them (CUDA_VISIBLE_DEVICES, so
SM_NUM_GPUS and the default workers per node follow), as k instances of a GPU type would
have: 4 GPUs and 2 nodes give algo-1 GPUs 0,1 and algo-2 GPUs 2,3.

With `image_uri`, each node's agent runs inside that image (docker or podman, see
container/run.py): the node directory's opt/ml is the container's /opt/ml (so the node's
layout root, as the agent sees it, is "/"), file:// stores and channels are mounted at the
same paths, and the engine process is the tagged process the controller follows.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainctl.cluster import (
    ClusterInfo,
    NodeInfo,
    host_name,
    loopback_name,
    loopback_network_env,
)
from trainctl.errors import SpecError
from trainctl.gpus import share_gpus, visible_gpus
from trainctl.image.container import IMAGE_PYTHON, container_mounts
from trainctl.procs import (
    ATTEMPT_TAG,
    HOME_TAG,
    JOB_TAG,
    NODE_TAG,
    end_processes,
    job_processes,
    nodes_running,
)
from trainctl.provisioning.base import (
    DEFAULT_MASTER_PORT,
    CapacityProbe,
    FaultInjection,
    NoCapacityError,
    NodeRunner,
    Provider,
    make_cluster,
)
from trainctl.provisioning.ports import LOOPBACK, free_port
from trainctl.spec.job import JobSpec
from trainctl.spec.request import CapacityRequest
from trainctl.spec.settings import get_settings
from trainctl.transport import RunningProcess
from trainctl.transport.local import LocalProcess

if TYPE_CHECKING:
    from trainctl.image.engine import Engine

# Host variables a containerised agent also gets (by name; the engine passes the values), so
# an s3:// store is reachable from inside as it is from a process on the host.
FORWARDED_TO_CONTAINERS = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_DEFAULT_REGION",
    "AWS_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
)
# How long lost_nodes waits to look again for a node it did not find (see there).
RESCAN_SECONDS = 0.5
ENGINE_MARKER = "container-engine"  # in the job's nodes dir: which engine ran its containers


@dataclass
class LocalRunner(NodeRunner):
    """The agent as a process of this machine, tagged with the job, in the node's root;
    `wrap` turns its command into the engine command that runs it in the job's image."""

    cluster: ClusterInfo
    rank: int
    root: Path
    python: str
    wrap: Callable[[list[str], set[str]], list[str]] | None = None
    env: dict[str, str] = field(default_factory=dict)  # the node's own (its GPUs)

    def command(self, argv: list[str], env_names: set[str]) -> list[str]:
        return argv if self.wrap is None else self.wrap(argv, env_names)

    def start(self, argv: list[str], env: dict[str, str]) -> RunningProcess:
        cluster = self.cluster
        tags = {JOB_TAG: cluster.job, NODE_TAG: str(self.rank), ATTEMPT_TAG: str(cluster.attempt)}
        env = {**env, **self.env}
        full_env = {**os.environ, **env, **tags}
        full_env.pop("TRAINCTL_CONTROLLER", None)
        if self.wrap is not None:
            (self.root / "opt" / "ml").mkdir(parents=True, exist_ok=True)  # its /opt/ml
        return LocalProcess(self.command(argv, set(env)), full_env, cwd=self.root)


class LocalProvider(Provider, CapacityProbe, FaultInjection):
    name = "local"

    def __init__(self, home: Path | None = None) -> None:
        self.home = home or get_settings().home
        self.home_tag = str(Path(self.home).resolve())
        # Jobs of this controller that run in an image: job -> its request (mounts, image).
        self._container_requests: dict[str, CapacityRequest] = {}
        # Capacity withheld by injected faults (nocapacity): job -> [(nodes, until)], until
        # in time.monotonic() (None: for good). This machine otherwise has room for any job.
        self._holds: dict[str, list[tuple[int, float | None]]] = {}
        self._full: dict[str, int] = {}  # job -> the size it was first provisioned at
        # (job, attempt) -> each rank's GPU ids ([] each on a machine without GPUs)
        self._gpus: dict[tuple[str, int], list[list[str]]] = {}

    def check_offline(self, spec: JobSpec, store_uri: str) -> None:
        """This machine's GPUs split evenly among the job's nodes, each node's workers at
        most its GPUs (NCCL needs a GPU each); local_gpu needs a GPU."""
        ids = visible_gpus()
        if not ids:
            if spec.instance_type == "local_gpu":
                raise SpecError(
                    "instance_type",
                    "local_gpu needs a GPU on this machine and none is visible (nvidia-smi "
                    "lists none, or CUDA_VISIBLE_DEVICES hides them all); use local",
                )
            return
        count = spec.instance_count
        if len(ids) % count:
            divisors = [str(n) for n in range(1, len(ids) + 1) if len(ids) % n == 0]
            raise SpecError(
                "instance_count",
                f"{count} local nodes cannot share this machine's {len(ids)} GPUs evenly; "
                f"use {', '.join(divisors)}",
            )
        per_node = len(ids) // count
        if spec.processes_per_host is not None and spec.processes_per_host > per_node:
            raise SpecError(
                "processes_per_host",
                f"{spec.processes_per_host} workers per node but each of the {count} local "
                f"node(s) has {per_node} GPU(s) of this machine's {len(ids)}: at most "
                f"{per_node} (one GPU each), or hide the GPUs (CUDA_VISIBLE_DEVICES=) to run "
                "on the CPU",
            )

    def nodes_dir(self, job: str) -> Path:
        return self.home / "nodes" / job

    def node_root(self, job: str, attempt: int, rank: int) -> Path:
        return self.nodes_dir(job) / f"attempt-{attempt}" / f"node-{rank}"

    def dry_run(self, request: CapacityRequest, job: str, attempt: int) -> list[dict[str, Any]]:
        return [
            {
                "service": "local",
                "operation": "CreateNode",
                "params": {"root": str(self.node_root(job, attempt, r)), "address": LOOPBACK},
            }
            for r in range(request.instance_count)
        ]

    def preflight(self, request: CapacityRequest) -> None:
        """With an image: an engine on this machine, and the image on it (pulled once),
        able to run the agent."""
        if request.image_uri:
            from trainctl.image.container import check_toolkit, ensure_image, local_runner

            engine = self._engine()
            ensure_image(engine, request.image_uri)
            check_toolkit(local_runner(), engine.path, request.image_uri)

    def _engine(self) -> Engine:
        from trainctl.errors import SpecError
        from trainctl.image.engine import find_engine

        engine = find_engine()
        if engine is None:
            raise SpecError(
                "image_uri",
                "running in a container image needs docker or podman on this machine and "
                "none is installed and answering; install one, or leave image_uri unset to "
                "run the entry point as processes",
            )
        return engine

    def planned_cluster(self, request: CapacityRequest, job: str, attempt: int) -> ClusterInfo:
        if request.image_uri:
            self._container_requests[job] = request
        return self._cluster(request, job, attempt, port=DEFAULT_MASTER_PORT)

    def available_nodes(self, request: CapacityRequest, job: str) -> int | None:
        """The job's full size (its first provision's) less what faults withhold now."""
        now = time.monotonic()
        held = sum(n for n, until in self._holds.get(job, []) if until is None or until > now)
        return max(0, self._full.get(job, request.instance_count) - held)

    def hold_capacity(self, job: str, nodes: int, seconds: float | None) -> None:
        until = None if seconds is None else time.monotonic() + seconds
        self._holds.setdefault(job, []).append((nodes, until))

    def provision(self, request: CapacityRequest, job: str, attempt: int) -> ClusterInfo:
        self._full.setdefault(job, request.instance_count)
        available = self.available_nodes(request, job)
        if available is not None and request.instance_count > available:
            raise NoCapacityError(
                f"no capacity for {request.instance_count} local node(s): {available} available "
                "(capacity withheld by an injected nocapacity fault)"
            )
        for rank in range(request.instance_count):
            self.node_root(job, attempt, rank).mkdir(parents=True, exist_ok=True)
        if request.image_uri:
            self._container_requests[job] = request
            (self.nodes_dir(job) / ENGINE_MARKER).write_text(self._engine().path)
        return self._cluster(request, job, attempt, port=free_port())

    def _cluster(
        self, request: CapacityRequest, job: str, attempt: int, *, port: int
    ) -> ClusterInfo:
        nodes = []
        for rank in range(request.instance_count):
            # In a container the node's opt/ml is /opt/ml: the layout root is "/" there.
            root = "/" if request.image_uri else str(self.node_root(job, attempt, rank))
            # In a container algo-N is mapped to the loopback address (--add-host); as plain
            # processes each node's name is a loopback address of its own.
            name = host_name(rank) if request.image_uri else loopback_name(rank)
            nodes.append(NodeInfo(rank=rank, host=name, address=LOOPBACK, root=root))
        # a resized elastic job's count may not divide them: the rest stay idle
        shares = share_gpus(visible_gpus(), request.instance_count)
        self._gpus[(job, attempt)] = shares
        return make_cluster(
            request,
            job,
            attempt,
            self.name,
            request.instance_type,
            nodes,
            master_port=port,
            gpus=len(shares[0]),
            network_env=loopback_network_env(),
        )

    def node_gpus(self, cluster: ClusterInfo, rank: int) -> list[str] | None:
        """The GPU ids of the node of `rank` (None: the machine has none to share)."""
        shares = self._gpus.get((cluster.job, cluster.attempt))
        return shares[rank] if shares and shares[rank] else None

    def runs_in_container(self, job: str) -> bool:
        """Whether `job`'s agents run in its image (known once planned or provisioned)."""
        return job in self._container_requests

    def container_argv(
        self, cluster: ClusterInfo, rank: int, argv: list[str], env_names: set[str]
    ) -> list[str]:
        """The engine command that runs the agent `argv` of `rank` in the job's image."""
        from trainctl.image.container import container_command, container_labels, container_name

        request = self._container_requests[cluster.job]
        assert request.image_uri is not None
        names = env_names | {name for name in FORWARDED_TO_CONTAINERS if name in os.environ}
        return container_command(
            self._engine(),
            request.image_uri,
            name=container_name(cluster.job, cluster.attempt, rank),
            labels=container_labels(cluster.job, cluster.attempt, rank),
            env=names,
            node_root=str(self.node_root(cluster.job, cluster.attempt, rank)),
            agent_argv=argv,
            # the engine exposes every GPU; CUDA_VISIBLE_DEVICES keeps the node to its own
            gpus=len(self.node_gpus(cluster, rank) or []),
            efa_devices=0,
            hosts=cluster.host_entries,
            mounts=container_mounts(request, argv),
        )

    def node_runner(self, cluster: ClusterInfo, rank: int) -> NodeRunner:
        root = self.node_root(cluster.job, cluster.attempt, rank)
        gpus = self.node_gpus(cluster, rank)
        env = {} if gpus is None else {"CUDA_VISIBLE_DEVICES": ",".join(gpus)}
        # This machine is the user's own: a process of theirs on a GPU (a notebook's CUDA
        # context) is not a fault, and a replaced node would get the same GPU.
        env["TRAINCTL_GPU_BUSY_FAILS_NODE"] = "0"
        env[HOME_TAG] = self.home_tag  # (the job's processes are this home's: see procs)
        if not self.runs_in_container(cluster.job):
            return LocalRunner(cluster, rank, root, python=sys.executable, env=env)
        wrap = partial(self.container_argv, cluster, rank)
        return LocalRunner(cluster, rank, root, python=IMAGE_PYTHON, wrap=wrap, env=env)

    def lost_nodes(self, cluster: ClusterInfo) -> dict[int, str]:
        """Nodes of `cluster` none of whose processes (the agent, the engine attached to
        its container) runs any more: killed, as a lost machine. (A node that ended on its
        own is told apart by the controller: its agent said how it ended.)"""
        ranks = {node.rank for node in cluster.nodes}
        missing = ranks - nodes_running(cluster.job, cluster.attempt, home=self.home_tag)
        if missing:
            # Once more, a moment later: an agent just started can be in its exec, which
            # lets its starter go on before its environment (the tags) can be read, and a
            # node taken for lost there relaunched an attempt 0.4 s old under a loaded suite.
            time.sleep(RESCAN_SECONDS)
            missing -= nodes_running(cluster.job, cluster.attempt, home=self.home_tag)
        return {rank: "its processes are gone (killed)" for rank in sorted(missing)}

    def kill_node(self, cluster: ClusterInfo, rank: int) -> None:
        """SIGKILL every process of the node at once, as losing the machine would."""
        engine = self._marked_engine(cluster.job)
        if engine is not None:
            from trainctl.image.container import container_name, remove_containers

            remove_containers(engine, [container_name(cluster.job, cluster.attempt, rank)])
        # This attempt's only: the controller may already be starting the next one there.
        end_processes(
            lambda: job_processes(cluster.job, rank, cluster.attempt, home=self.home_tag), grace=0
        )

    def terminate(self, job: str, *, grace: float) -> None:
        # The attached engine processes are tagged: their SIGTERM reaches the agents inside
        # (sig-proxy), and what still runs after the grace period goes with the containers.
        end_processes(lambda: job_processes(job, home=self.home_tag), grace)
        engine = self._marked_engine(job)
        left: Exception | None = None
        if engine is not None:
            from trainctl.image.container import ContainerCleanupError, remove_job_containers

            try:
                remove_job_containers(engine, job)
            except ContainerCleanupError as exc:  # the rest is removed all the same
                left = exc
        shutil.rmtree(self.nodes_dir(job), ignore_errors=True)
        parent = self.nodes_dir(job).parent
        try:
            parent.rmdir()  # only if no other job's nodes are there
        except OSError:
            pass
        if left is not None:
            raise left

    def _marked_engine(self, job: str) -> Engine | None:
        """The engine that ran `job`'s containers (recorded at provision), if it did."""
        from trainctl.image.engine import Engine

        try:
            path = (self.nodes_dir(job) / ENGINE_MARKER).read_text().strip()
        except OSError:
            return None
        return Engine(Path(path).name, path) if path else None

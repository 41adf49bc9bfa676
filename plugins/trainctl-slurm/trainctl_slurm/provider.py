"""The Slurm provider: an attempt's nodes are one Slurm allocation, each node's agent a job
step on its node.

- **Capacity.** `provision` submits a batch script (the dry run prints it) that asks for N
  whole nodes, one task each, with the job's `slurm:` options, a time limit that follows
  `max_run`, `--signal=USR1@notice_seconds` and `--no-requeue` (trainctl relaunches,
  Slurm does not), and that only holds the allocation. It returns once the allocation runs;
  while it waits in the queue, the job waits for capacity with Slurm's reason (the next call
  finds the same allocation by its name, `trainctl-<job>-a<attempt>`).
- **Agents.** Each node's agent is `srun --jobid=ID --nodelist=NODE --ntasks=1` started
  where the controller runs (a login node): its output comes back through srun, and Slurm's
  signals reach it as a step's. The node directories are under `node_dir` (default
  trainctl's home), which the cluster's shared file system puts on every node, as it does
  the Python that runs trainctl; the store is a shared path or s3://.
- **Faults.** Preemption (SIGTERM to the steps) and the time-limit warning (SIGUSR1) are
  interruption notices (TRAINCTL_NOTICE_SIGNALS): an emergency checkpoint, no step lost; the
  controller's own stop reaches an agent as SIGUSR2 through srun. A node that is drained,
  down or failing is a lost node; an allocation that ended under the job (preempted, timed
  out, node failure) loses every node; one the user cancelled (`scancel`) stops the job.
- **Nothing left.** `terminate` cancels every allocation named after the job, pending ones
  too, and waits until Slurm has let them go.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainctl.plugin import (
    ATTEMPT_TAG,
    DEFAULT_MASTER_PORT,
    HOME_TAG,
    JOB_TAG,
    LOOPBACK,
    NODE_TAG,
    CapacityProbe,
    CapacityRequest,
    ClusterInfo,
    FaultInjection,
    JobSpec,
    LocalProcess,
    NoCapacityError,
    NodeInfo,
    NodeRunner,
    Provider,
    RunningProcess,
    SpecError,
    StoppedOutsideError,
    free_port,
    get_settings,
    is_loopback,
    loopback_name,
    loopback_network_env,
    make_cluster,
)
from trainctl_slurm import slurm
from trainctl_slurm.options import SlurmOptions

# How long provision waits for a submitted allocation to start before it says the job waits
# in the queue, with Slurm's reason (the controller asks again every couple of seconds, and
# the next call finds the same allocation).
START_WAIT_SECONDS = 5.0
POLL_SECONDS = 0.5
# How long the check before a submit waits for the cluster to answer (a reachable
# slurmctld answers sinfo at once; one that is not makes the commands retry for minutes).
PREFLIGHT_SECONDS = 15.0
# The allocation outlives the training budget by this much: staging, the final upload.
TIME_MARGIN_SECONDS = 600
# Where the batch script's own output goes (it only holds the allocation).
HOLDER = "exec sleep infinity"


def allocation_name(job: str, attempt: int) -> str:
    return f"trainctl-{job}-a{attempt}"


def step_name(rank: int) -> str:
    return f"trainctl-node-{rank}"


def options_of(request: CapacityRequest) -> SlurmOptions:
    return SlurmOptions.model_validate(request.provider_options.get("slurm", {}))


def _time_limit(max_run: int) -> str:
    """sbatch's --time (D-HH:MM:SS) for `max_run` seconds of training and the margin."""
    seconds = max_run + TIME_MARGIN_SECONDS
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"


def sbatch_options(request: CapacityRequest, job: str, attempt: int) -> list[str]:
    options = options_of(request)
    out = [
        f"--job-name={allocation_name(job, attempt)}",
        f"--nodes={request.instance_count}",
        "--ntasks-per-node=1",
        f"--time={_time_limit(request.max_run)}",
        f"--signal=USR1@{options.notice_seconds}",
        "--no-requeue",
        f"--output={node_dir(options) / job / f'attempt-{attempt}' / 'slurm-%j.out'}",
    ]
    given = {
        "partition": options.partition,
        "account": options.account,
        "qos": options.qos,
        "gpus-per-node": options.gpus_per_node,
        "gres": options.gres,
        "cpus-per-task": options.cpus_per_node,
        "mem": options.mem,
        "constraint": options.constraint,
        "reservation": options.reservation,
    }
    out += [f"--{name}={value}" for name, value in given.items() if value is not None]
    if options.exclusive:
        out.append("--exclusive")
    return out + list(options.sbatch_args)


def batch_script(request: CapacityRequest, job: str, attempt: int) -> str:
    lines = ["#!/bin/bash"]
    lines += [f"#SBATCH {option}" for option in sbatch_options(request, job, attempt)]
    lines += [
        "# trainctl holds this allocation: each node's agent is a job step that trainctl's",
        "# controller starts with srun.",
        HOLDER,
    ]
    return "\n".join(lines) + "\n"


def node_dir(options: SlurmOptions) -> Path:
    return (
        Path(options.node_dir).expanduser() if options.node_dir else get_settings().home / "slurm"
    )


def srun_argv(job_id: str, node: str, rank: int, root: str, options: SlurmOptions) -> list[str]:
    argv = [
        "srun", f"--jobid={job_id}", f"--nodelist={node}", "--nodes=1", "--ntasks=1",
        f"--job-name={step_name(rank)}", f"--chdir={root}", "--export=ALL",
        "--kill-on-bad-exit=0", "--unbuffered",
    ]  # fmt: skip
    if options.gpus_per_node:
        argv.append(f"--gpus-per-node={options.gpus_per_node}")
    return argv


class SrunProcess(LocalProcess):
    """A node agent as srun runs it: srun forwards its signals to the step, so the
    controller's stop goes as SIGUSR2 (SIGTERM is Slurm's preemption notice); a kill
    cancels the step on its node, then srun."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path, job_id: str, step: str):
        super().__init__(argv, env, cwd)
        self.job_id = job_id
        self.step = step

    def terminate(self) -> None:
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGUSR2)

    def kill(self) -> None:
        step = slurm.steps(self.job_id).get(self.step)
        if step:
            try:
                slurm.cancel(step, signal="KILL")
            except slurm.SlurmError:
                pass
        super().kill()


@dataclass
class SrunRunner(NodeRunner):
    cluster: ClusterInfo
    rank: int
    job_id: str
    node: str  # the Slurm node name
    root: Path
    options: SlurmOptions
    python: str = sys.executable

    def command(self, argv: list[str], env_names: set[str]) -> list[str]:
        return [*srun_argv(self.job_id, self.node, self.rank, str(self.root), self.options), *argv]

    def start(self, argv: list[str], env: dict[str, str]) -> RunningProcess:
        cluster = self.cluster
        tags = {JOB_TAG: cluster.job, NODE_TAG: str(self.rank), ATTEMPT_TAG: str(cluster.attempt)}
        tags[HOME_TAG] = str(get_settings().home.resolve())  # (whose nodes: see procs)
        full_env = {**os.environ, **env, **tags, "TRAINCTL_NOTICE_SIGNALS": "TERM,USR1"}
        full_env.pop("TRAINCTL_CONTROLLER", None)
        self.root.mkdir(parents=True, exist_ok=True)
        return SrunProcess(
            self.command(argv, set(env)), full_env, self.root, self.job_id, step_name(self.rank)
        )


class SlurmProvider(Provider, CapacityProbe, FaultInjection):
    name = "slurm"

    def __init__(self) -> None:
        # Allocations this process cancelled itself: their end is not the user's scancel.
        self._cancelled: set[str] = set()
        self._options: dict[str, SlurmOptions] = {}  # job -> its options, once provisioned
        # (job, attempt) -> (Slurm job id, node names), once provisioned
        self._allocations: dict[tuple[str, int], tuple[str, list[str]]] = {}

    # -- checks ---------------------------------------------------------------------------
    def check_offline(self, spec: JobSpec, store_uri: str) -> None:
        if spec.image_uri or spec.build_image:
            raise SpecError(
                "image_uri",
                "the slurm provider runs each node's agent as processes on the node; a "
                "container image is not supported on it yet",
            )
        if not store_uri.startswith(("s3://", "file://")):
            raise SpecError("store", f"{store_uri}: the Slurm nodes need a shared path or s3://")

    def preflight(self, request: CapacityRequest) -> None:
        missing = slurm.missing_commands()
        if missing:
            raise SpecError(
                "instance_type",
                f"'slurm' needs Slurm's commands on this machine (a login node): "
                f"{', '.join(missing)} not found",
            )
        conf = os.environ.get("SLURM_CONF")
        if conf and not os.path.isfile(conf):  # (Slurm's commands retry it for a minute)
            raise SpecError(
                "instance_type",
                f"'slurm': SLURM_CONF is {conf}, which is not a file: set it to the "
                "cluster's slurm.conf, or unset it where /etc/slurm/slurm.conf is there",
            )
        try:  # the cluster answers (a login node finds it through slurm.conf or SLURM_CONF)
            partitions = slurm.run("sinfo", "-h", "-o", "%P", timeout=PREFLIGHT_SECONDS)
        except slurm.SlurmError as exc:
            raise SpecError(
                "instance_type",
                f"'slurm': no Slurm cluster answers from this machine ({exc}); run where "
                "Slurm's commands reach one (a login node), or set SLURM_CONF to its "
                "slurm.conf (one machine: docs/providers.md, Slurm on this machine)",
            ) from None
        if not partitions.split():
            raise SpecError("instance_type", "'slurm': the Slurm cluster has no partition")
        options = options_of(request)
        if options.partition:
            try:
                found = slurm.run("sinfo", "-h", f"--partition={options.partition}", "-o", "%P")
            except slurm.SlurmError as exc:
                raise SpecError("slurm.partition", str(exc)) from None
            if not found.strip():
                names = partitions.split()
                raise SpecError(
                    "slurm.partition",
                    f"{options.partition!r} is not a partition of this cluster "
                    f"({', '.join(n.rstrip('*') for n in names) or 'none'})",
                )

    # -- planning -------------------------------------------------------------------------
    def dry_run(self, request: CapacityRequest, job: str, attempt: int) -> list[dict[str, Any]]:
        script = batch_script(request, job, attempt)
        return [
            {
                "service": "slurm",
                "operation": "sbatch",
                "params": {"argv": ["sbatch", "--parsable", "<script>"], "script": script},
            }
        ]

    def planned_cluster(self, request: CapacityRequest, job: str, attempt: int) -> ClusterInfo:
        options = options_of(request)
        nodes = [
            NodeInfo(
                rank=r,
                host=f"<node {r + 1} of the allocation>",
                address=f"<node {r + 1} address>",
                root=str(self._root(options, job, attempt, r)),
            )
            for r in range(request.instance_count)
        ]
        return make_cluster(
            request, job, attempt, self.name, request.instance_type, nodes,
            gpus=options.gpus_per_node or 0,
        )  # fmt: skip

    def _root(self, options: SlurmOptions, job: str, attempt: int, rank: int) -> Path:
        return node_dir(options) / job / f"attempt-{attempt}" / f"node-{rank}"

    # -- capacity -------------------------------------------------------------------------
    def provision(self, request: CapacityRequest, job: str, attempt: int) -> ClusterInfo:
        options = options_of(request)
        self._options[job] = options
        name = allocation_name(job, attempt)
        self._check_not_cancelled(job, attempt)
        current = [a for a in slurm.allocations(name=name) if a.active]
        held = current[0] if current else None
        if held is not None and len(self._planned_nodes(held)) not in (0, request.instance_count):
            self._cancel([held.id])  # another size (an elastic resize): ask anew
            held = None
        if held is None:
            script = batch_script(request, job, attempt)
            folder = node_dir(options) / job / f"attempt-{attempt}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "allocation.sh").write_text(script)
            job_id = slurm.run("sbatch", "--parsable", str(folder / "allocation.sh")).strip()
            job_id = job_id.split(";")[0]
        else:
            job_id = held.id
        running = self._wait_running(job_id)
        names = slurm.hostnames(running.nodelist)
        self._allocations[(job, attempt)] = (job_id, names)
        return self._cluster(request, options, job, attempt, job_id, names)

    def available_nodes(self, request: CapacityRequest, job: str) -> int | None:
        """The nodes a new allocation of the job could have now, asked of Slurm without
        queueing one: the partition's idle nodes (sinfo), and those the job's running
        allocation holds and still serves it. An elastic job below its size grows only once
        they are there, instead of requeueing to find out; None when Slurm does not answer."""
        try:
            free = set(slurm.idle_nodes(options_of(request).partition))
            return len(free | self._serving(job))
        except slurm.SlurmError:
            return None

    def _serving(self, job: str) -> set[str]:
        """The nodes of the job's latest allocation, while it runs, that are not drained or
        down."""
        attempts = [attempt for (name, attempt) in self._allocations if name == job]
        if not attempts:
            return set()
        job_id, names = self._allocations[(job, max(attempts))]
        found = slurm.allocations(job_id=job_id)
        if not found or not found[0].active:
            return set()
        states = slurm.node_states(names)
        return {n for n in names if not slurm.node_is_gone(states.get(n, ("unknown", ""))[0])}

    def _planned_nodes(self, held: slurm.Allocation) -> list[str]:
        return slurm.hostnames(held.nodelist) if held.nodelist else []

    def _wait_running(self, job_id: str) -> slurm.Allocation:
        deadline = time.monotonic() + START_WAIT_SECONDS
        while True:
            found = slurm.allocations(job_id=job_id)
            if not found:
                raise NoCapacityError(f"Slurm job {job_id} is gone from the queue")
            alloc = found[0]
            if alloc.state == "RUNNING":
                return alloc
            if not alloc.active:
                raise NoCapacityError(f"Slurm job {job_id} ended before it ran: {alloc.state}")
            if time.monotonic() >= deadline:
                # kept: the next provision of this attempt finds it by name
                raise NoCapacityError(
                    f"Slurm job {job_id} is pending in the queue ({alloc.reason or alloc.state})"
                )
            time.sleep(POLL_SECONDS)

    def _cluster(
        self,
        request: CapacityRequest,
        options: SlurmOptions,
        job: str,
        attempt: int,
        job_id: str,
        names: list[str],
    ) -> ClusterInfo:
        fields = slurm.node_fields(names)
        addresses = [fields.get(n, {}).get("NodeAddr") or n for n in names]
        # Nodes that share an address (several slurmd on one machine) get a loopback name
        # each, as local nodes do, and a free port of that machine; a cluster's nodes their
        # own names and a port of the allocation's.
        shared = len(set(addresses)) < len(addresses) and all(map(is_loopback, addresses))
        nodes = []
        for rank, (node, address) in enumerate(zip(names, addresses, strict=True)):
            host = loopback_name(rank) if shared else node
            nodes.append(
                NodeInfo(
                    rank=rank,
                    host=host,
                    address=LOOPBACK if shared else address,
                    root=str(self._root(options, job, attempt, rank)),
                )
            )
        port = free_port() if shared else DEFAULT_MASTER_PORT + int(job_id) % 1000
        return make_cluster(
            request, job, attempt, self.name, request.instance_type, nodes,
            master_port=port, gpus=options.gpus_per_node or 0,
            network_env=loopback_network_env() if shared else None, capacity_id=job_id,
        )  # fmt: skip

    def node_runner(self, cluster: ClusterInfo, rank: int) -> NodeRunner:
        if cluster.nodes[rank].host.startswith("<"):  # a dry run's planned cluster
            job_id, names = "<job id>", [f"<node {r + 1}>" for r in range(len(cluster.nodes))]
        else:
            job_id, names = self._allocation(cluster)
        root = Path(cluster.nodes[rank].root)
        options = self._options.get(cluster.job, SlurmOptions())
        return SrunRunner(cluster, rank, job_id, names[rank], root, options)

    def _allocation(self, cluster: ClusterInfo) -> tuple[str, list[str]]:
        """The attempt's Slurm job id and node names (asked of Slurm by the allocation's name
        in a process that did not provision it)."""
        key = (cluster.job, cluster.attempt)
        if key not in self._allocations:
            found = [a for a in slurm.allocations(name=allocation_name(*key)) if a.active]
            if not found:
                raise NoCapacityError(f"{allocation_name(*key)} is not in Slurm's queue")
            self._allocations[key] = (found[0].id, slurm.hostnames(found[0].nodelist))
        return self._allocations[key]

    # -- watching -------------------------------------------------------------------------
    def lost_nodes(self, cluster: ClusterInfo) -> dict[int, str]:
        job_id, names = self._allocation(cluster)
        found = slurm.allocations(job_id=job_id)
        if found and found[0].state == "COMPLETING":
            return {}  # ending: its end state says why, in a moment
        if not found or not found[0].active:
            state = found[0].state if found else "gone"
            if found and self._cancelled_by_user(found[0]):
                raise StoppedOutsideError(f"Slurm job {job_id} was cancelled (scancel)")
            why = f"its Slurm allocation {job_id} ended ({state})"
            return {rank: why for rank in range(len(names))}
        states = slurm.node_states(names)
        lost = {}
        for rank, node in enumerate(names):
            state, reason = states.get(node, ("unknown", ""))
            if slurm.node_is_gone(state):
                because = f": {reason}" if reason and reason != "none" else ""
                lost[rank] = f"Slurm node {node} is {state}{because}"
        return lost

    def _check_not_cancelled(self, job: str, attempt: int) -> None:
        """The attempt before this one ended because the user cancelled its allocation:
        the job stops rather than asking Slurm again."""
        if attempt < 2:
            return
        for alloc in slurm.allocations(name=allocation_name(job, attempt - 1)):
            if self._cancelled_by_user(alloc):
                raise StoppedOutsideError(f"Slurm job {alloc.id} was cancelled (scancel)")

    def _cancelled_by_user(self, alloc: slurm.Allocation) -> bool:
        """Cancelled, and not by this provider (a relaunch, a stop): the user's scancel."""
        return alloc.state == "CANCELLED" and alloc.id not in self._cancelled

    # -- faults ---------------------------------------------------------------------------
    def kill_node(self, cluster: ClusterInfo, rank: int) -> None:
        """SIGKILL the node's agent step and everything it started, as losing the machine
        would (the allocation itself stays)."""
        job_id, _ = self._allocation(cluster)
        step = slurm.steps(job_id).get(step_name(rank))
        if step is None:
            raise RuntimeError(f"no step of rank {rank} in Slurm job {job_id}")
        slurm.cancel(step, signal="KILL")

    # -- ending ---------------------------------------------------------------------------
    def terminate(self, job: str, *, grace: float) -> None:
        prefix = f"trainctl-{job}-a"
        mine = [
            a for a in slurm.allocations() if a.name.startswith(prefix) and a.active
        ]  # (squeue's --name matches whole names only)
        # (one already ending, cancelled by the user say, is waited for, not cancelled again:
        # how it ended stays the user's)
        self._cancel([a.id for a in mine if a.state != "COMPLETING"])
        deadline = time.monotonic() + grace + 60
        while mine and time.monotonic() < deadline:
            ids = {a.id for a in mine}
            mine = [a for a in slurm.allocations() if a.id in ids and a.active]
            if mine:
                time.sleep(POLL_SECONDS)
        if mine:
            held = ", ".join(a.id for a in mine)
            raise slurm.SlurmError(f"Slurm still holds {held} {grace + 60:.0f} s after scancel")
        for key in [k for k in self._allocations if k[0] == job]:
            del self._allocations[key]
        options = self._options.get(job, SlurmOptions())
        shutil.rmtree(node_dir(options) / job, ignore_errors=True)
        try:
            node_dir(options).rmdir()  # only if no other job's nodes are there
        except OSError:
            pass

    def _cancel(self, ids: list[str]) -> None:
        self._cancelled.update(ids)
        slurm.cancel(*ids)

"""The static SSH provider: the user's own machines (`instance_type="ssh"`, `hosts=[...]`).

Rank r runs on hosts[r] (the first `instance_count` hosts, in order). Each node is a
per-job, per-attempt, per-rank directory under the remote user's home,
`~/.trainctl/nodes/<job>/attempt-<n>/node-<rank>` (per rank: several "hosts" may be one
machine), and its agent is a detached remote process (trainctl.transport.ssh.SshProcess)
carrying the job's tags in its environment, so every process of the job on a host is found
by scanning /proc there, as the local provider does here.

What `terminate` needs (the job's hosts) is kept in `$TRAINCTL_HOME/ssh/<job>.json`, so a
restarted controller or `trainctl stop` can clean up without the spec in memory.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from trainctl.cluster import (
    ClusterInfo,
    NodeInfo,
    is_loopback,
    loopback_network_env,
    node_name,
)
from trainctl.errors import SpecError, TrainctlError
from trainctl.image.container import IMAGE_PYTHON
from trainctl.provisioning.base import (
    DEFAULT_MASTER_PORT,
    FaultInjection,
    NodeRunner,
    Provider,
    make_cluster,
)
from trainctl.provisioning.remote import (
    SshProvisionError,
    SshRunner,
    ensure_remote_image,
    remote_engine,
)
from trainctl.spec.capacity import SshHost
from trainctl.spec.checks import JOB_NAME_RE, uses_s3
from trainctl.spec.request import CapacityRequest
from trainctl.spec.settings import get_settings

T = TypeVar("T")

NODES_DIR = ".trainctl/nodes"  # under the remote home

# Per rank, at provision: make the node dir, (rank 0) find a free port for the master, and
# count the host's GPUs (nvidia-smi -L; None without the driver). Run after the source of
# provisioning.ports: the port is picked, and claimed on the host, as a local job's is (a
# host's jobs share its addresses; bind(0) handed out ports that the host's outgoing
# connections could take before torchrun bound them).
PREPARE = r"""
import json, os, shutil, subprocess, sys
job, attempt, rank, want_port = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "port"
root = os.path.join(os.path.expanduser("~"), ".trainctl", "nodes", job, "attempt-" + attempt,
                    "node-" + rank)
os.makedirs(root, exist_ok=True)
port = free_port("0.0.0.0") if want_port else None  # (provisioning.ports, sent with this)
gpus = None
if shutil.which("nvidia-smi"):
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                                 timeout=20).stdout
        gpus = sum(1 for line in listing.splitlines() if line.startswith("GPU "))
    except (OSError, subprocess.SubprocessError):
        pass
print("trainctl-prepare " + json.dumps({"root": root, "port": port, "gpus": gpus}))
"""


def prepare_script() -> str:
    """PREPARE with what it runs of provisioning.ports (standard library only)."""
    from trainctl.provisioning import ports

    return Path(ports.__file__).read_text() + PREPARE


# End a job's processes on this host, found by their tags in /proc/*/environ (argv: JOB
# NODE-or-empty GRACE keep|remove): SIGTERM, up to GRACE seconds, then SIGKILL until none
# is left; with `remove`, delete the job's node dirs.
END_PROCESSES = r"""
import os, shutil, signal, sys, time
job, node, grace, remove = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4] == "remove"
attempt = sys.argv[5] if len(sys.argv) > 5 else ""
want = [b"TRAINCTL_JOB=" + job.encode()]
if node:
    want.append(b"TRAINCTL_NODE=" + node.encode())
if attempt:
    want.append(b"TRAINCTL_ATTEMPT=" + attempt.encode())
me = os.getpid()
def find():
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open("/proc/%s/environ" % entry, "rb") as f:
                env = f.read().split(b"\0")
            with open("/proc/%s/stat" % entry) as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X") and all(w in env for w in want):
            found.append(int(entry))
    return found
def send(pids, sig):
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass
pids = find()
ended = len(pids)
if pids and grace > 0:
    send(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and find():
        time.sleep(0.1)
for _ in range(50):
    pids = find()
    if not pids:
        break
    send(pids, signal.SIGKILL)
    time.sleep(0.1)
left = find()
if remove:
    # The job's containers (agents that ran in its image), by label, with either engine.
    import subprocess
    for engine in filter(None, (shutil.which("podman"), shutil.which("docker"))):
        label = "label=trainctl.job=" + job
        try:
            ids = subprocess.run([engine, "ps", "-aq", "--filter", label], capture_output=True,
                                 text=True, timeout=60).stdout.split()
            if ids:
                subprocess.run([engine, "rm", "-f", *ids], capture_output=True, timeout=120)
        except (OSError, subprocess.SubprocessError):
            pass
    nodes = os.path.join(os.path.expanduser("~"), ".trainctl", "nodes")
    shutil.rmtree(os.path.join(nodes, job), ignore_errors=True)
    try:
        os.rmdir(nodes)
    except OSError:
        pass
print("trainctl-end %d %d" % (ended, len(left)))
"""


class SshTeardownError(TrainctlError):
    """Processes or node dirs of a job could not be removed from some hosts."""


def _check_job_name(job: str) -> None:
    # The name becomes remote paths and a file name here: only the job-name alphabet.
    if not JOB_NAME_RE.fullmatch(job):
        raise SpecError("job_name", f"{job!r} is not a job name")


def _each(items: list[T], fn: Callable[[T], Any]) -> list[tuple[T, Any, BaseException | None]]:
    """fn(item) for every item in parallel; (item, result, error) in order, never raising."""

    def guarded(item: T) -> tuple[T, Any, BaseException | None]:
        try:
            return item, fn(item), None
        except Exception as exc:
            return item, None, exc

    if len(items) <= 1:
        return [guarded(i) for i in items]
    with ThreadPoolExecutor(max_workers=min(16, len(items))) as pool:
        return list(pool.map(guarded, items))


class SshProvider(Provider, FaultInjection):
    name = "ssh"
    # How long a host may refuse connections at provision before the job fails (a host
    # that is rebooting gets this long; a wrong address fails after it).
    connect_timeout: float = 20.0

    def __init__(self, home: Path | None = None) -> None:
        self.home = home or get_settings().home
        self._lock = threading.Lock()
        self._hosts: dict[str, list[SshHost]] = {}  # by job: provisioned or planned
        # (job, rank) -> (the agent's PYTHONPATH env, whether boto3 was made sure of)
        self._runtimes: dict[tuple[str, int], tuple[dict[str, str], bool]] = {}
        # (job, rank) -> (request, the host's engine path, the node dir on the host) for jobs
        # whose agents run in the job's image
        self._containers: dict[tuple[str, int], tuple[CapacityRequest, str, str]] = {}

    # -- the job's record ------------------------------------------------------------------
    def job_file(self, job: str) -> Path:
        return self.home / "ssh" / f"{job}.json"

    def _save_hosts(self, job: str, hosts: list[SshHost]) -> None:
        path = self.job_file(job)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp-{os.getpid()}-{threading.get_ident()}")
        data = {"job": job, "hosts": [h.model_dump(exclude_defaults=True) for h in hosts]}
        tmp.write_text(json.dumps(data, indent=2))
        tmp.replace(path)

    def job_hosts(self, job: str) -> list[SshHost]:
        """The hosts the job ran on (from its record), in rank order; [] if none is known."""
        try:
            data = json.loads(self.job_file(job).read_text())
        except FileNotFoundError:
            return []
        return [SshHost.model_validate(h) for h in data["hosts"]]

    def _host(self, job: str, rank: int) -> SshHost:
        with self._lock:
            hosts = self._hosts.get(job) or self.job_hosts(job)
        if rank >= len(hosts):
            raise TrainctlError(f"job {job!r} has no ssh host for rank {rank} on record")
        return hosts[rank]

    def _connector(self, host: SshHost) -> Any:
        from trainctl.transport.ssh import SshConnector

        return SshConnector(host, known_hosts=self.home / "known_hosts")

    # -- Provider ------------------------------------------------------------------------
    def dry_run(self, request: CapacityRequest, job: str, attempt: int) -> list[dict[str, Any]]:
        from trainctl.transport.ssh import default_user

        requests: list[dict[str, Any]] = []
        for rank, host in enumerate(request.ssh.hosts[: request.instance_count]):
            target = {"host": host.address, "port": host.port, "user": host.user or default_user()}
            connect = {**target, "rank": rank, "python": host.python}
            if host.key_file:
                connect["key_file"] = host.key_file  # the path only, never the key
            connect["host_key"] = "pinned" if host.host_key else "known_hosts"
            requests.append({"service": "ssh", "operation": "Connect", "params": connect})
            root = f"~/{NODES_DIR}/{job}/attempt-{attempt}/node-{rank}"
            requests.append(
                {"service": "ssh", "operation": "CreateNodeDir", "params": {**target, "path": root}}
            )
            if rank == 0:
                requests.append(
                    {"service": "ssh", "operation": "ReservePort", "params": {**target}}
                )
        return requests

    def preflight(self, request: CapacityRequest) -> None:
        """Every host accepts an SSH connection with its key and pinned host key; with an
        image, every host has an engine, and the image (pulled now), able to run the agent."""
        from trainctl.transport.ssh import SshError

        hosts = list(enumerate(request.ssh.hosts[: request.instance_count]))

        def reach(item: tuple[int, SshHost]) -> None:
            conn = self._connector(item[1]).connect(timeout=self.connect_timeout)
            try:
                if request.image_uri:
                    ensure_remote_image(conn, remote_engine(conn), request.image_uri)
            finally:
                conn.close()

        for (index, _host), _, error in _each(hosts, reach):
            if isinstance(error, SshError | SshProvisionError):
                raise SpecError(f"hosts[{index}]", str(error))
            if error is not None:
                raise error

    def provision(self, request: CapacityRequest, job: str, attempt: int) -> ClusterInfo:
        from trainctl.transport.bootstrap import ensure_agent

        _check_job_name(job)
        hosts = list(request.ssh.hosts[: request.instance_count])
        if len(hosts) < request.instance_count:
            raise SpecError(
                "hosts", f"{request.instance_count} nodes but only {len(request.ssh.hosts)} host(s)"
            )
        # Recorded before any host is touched: a half-made attempt is cleaned up too.
        self._save_hosts(job, hosts)
        with self._lock:
            self._hosts[job] = hosts
        s3 = uses_s3(request)

        def prepare(rank: int) -> dict[str, Any]:
            conn = self._connector(hosts[rank]).connect(timeout=self.connect_timeout)
            try:
                text = conn.check_python(
                    prepare_script(),
                    job,
                    str(attempt),
                    str(rank),
                    "port" if rank == 0 else "-",
                    what="create the node directory",
                    marker="trainctl-prepare",
                    timeout=60,
                )
                node = json.loads(text)
                if request.image_uri:
                    # The agent runs in the image: the host needs an engine and the image,
                    # not trainctl.
                    node["engine"] = remote_engine(conn)
                    ensure_remote_image(conn, node["engine"], request.image_uri)
                    conn.makedirs(f"{node['root']}/opt/ml")
                    node["env"] = {}
                else:
                    node["env"] = ensure_agent(conn, s3=s3).env
                return node
            finally:
                conn.close()

        results = _each(list(range(len(hosts))), prepare)
        failed = [(rank, error) for rank, _, error in results if error is not None]
        if failed:
            detail = "; ".join(f"hosts[{rank}]: {error}" for rank, error in failed)
            raise SshProvisionError(f"cannot provision {len(failed)} ssh host(s): {detail}")
        nodes_info = [result for _, result, _ in results]
        # A host entry without `gpus:` has the GPUs nvidia-smi found there.
        hosts = [
            host.model_copy(update={"gpus": node["gpus"]})
            if not host.gpus and node.get("gpus")
            else host
            for host, node in zip(hosts, nodes_info, strict=True)
        ]
        self._save_hosts(job, hosts)
        with self._lock:
            self._hosts[job] = hosts
            for rank, node in enumerate(nodes_info):
                self._runtimes[(job, rank)] = (node["env"], s3)
                if request.image_uri:
                    self._containers[(job, rank)] = (request, node["engine"], str(node["root"]))
        roots = [str(node["root"]) for node in nodes_info]
        if request.image_uri:  # inside the container the node's opt/ml is /opt/ml
            roots = ["/"] * len(roots)
        return self._cluster(request, job, attempt, roots, int(nodes_info[0]["port"]), hosts)

    def planned_cluster(self, request: CapacityRequest, job: str, attempt: int) -> ClusterInfo:
        """Addresses are the hosts'; node dirs under the remote home, shown as `~`."""
        with self._lock:
            self._hosts[job] = list(request.ssh.hosts[: request.instance_count])
        roots = [
            f"~/{NODES_DIR}/{job}/attempt-{attempt}/node-{rank}"
            for rank in range(request.instance_count)
        ]
        return self._cluster(request, job, attempt, roots, DEFAULT_MASTER_PORT)

    def _cluster(
        self,
        request: CapacityRequest,
        job: str,
        attempt: int,
        roots: list[str],
        port: int,
        hosts: list[SshHost] | None = None,
    ) -> ClusterInfo:
        hosts = hosts or request.ssh.hosts[: request.instance_count]
        network_env: dict[str, str] = {}
        if is_loopback(hosts[0].address):
            network_env = loopback_network_env()
        nodes = [
            NodeInfo(
                rank=rank,
                host=node_name(rank, host.address, in_container=bool(request.image_uri)),
                address=host.address,
                root=root,
            )
            for rank, (host, root) in enumerate(zip(hosts, roots, strict=True))
        ]
        # one worker per GPU; the fewest any host has, as every node runs the same count
        return make_cluster(
            request,
            job,
            attempt,
            self.name,
            request.instance_type,
            nodes,
            master_port=port,
            gpus=min(h.gpus for h in hosts),
            network_env=network_env,
        )

    def node_runner(self, cluster: ClusterInfo, rank: int) -> NodeRunner:
        """The agent over SSH on the host of `rank`, with what provision prepared there."""
        host = self._host(cluster.job, rank)
        runner = SshRunner(
            target=host,
            cluster=cluster,
            rank=rank,
            python=host.python,
            known_hosts=self.home / "known_hosts",
            connect_timeout=self.connect_timeout,
        )
        with self._lock:
            container = self._containers.get((cluster.job, rank))
            runtime_env, has_s3 = self._runtimes.get((cluster.job, rank), (None, False))
        if container is not None:
            request, engine_path, host_root = container
            return replace(
                runner,
                python=IMAGE_PYTHON,
                image_uri=request.image_uri,
                request=request,
                engine_path=engine_path,
                host_root=host_root,
            )
        # A store on S3 that provision did not expect gets boto3 at start (runtime_env None).
        s3_store = get_settings().store_uri.startswith("s3://")
        if runtime_env is not None and (has_s3 or not s3_store):
            runner = replace(runner, runtime_env=runtime_env)
        return runner

    def _end_on_host(
        self, host: SshHost, job: str, node: str, grace: float, remove: bool, attempt: str = ""
    ) -> str:
        conn = self._connector(host).connect(timeout=self.connect_timeout)
        try:
            return conn.check_python(
                END_PROCESSES,
                job,
                node,
                str(grace),
                "remove" if remove else "keep",
                attempt,
                what=f"end the processes of job {job}",
                marker="trainctl-end",
                timeout=grace + 60,
            )
        finally:
            conn.close()

    def kill_node(self, cluster: ClusterInfo, rank: int) -> None:
        """SIGKILL every process of the node on its host at once, as losing it would."""
        from trainctl.image.container import container_name

        host = self._host(cluster.job, rank)
        if (cluster.job, rank) in self._containers:
            _, engine_path, _ = self._containers[(cluster.job, rank)]
            conn = self._connector(host).connect(timeout=self.connect_timeout)
            try:
                name = container_name(cluster.job, cluster.attempt, rank)
                conn.run([engine_path, "rm", "-f", name], timeout=120)
            finally:
                conn.close()
        # This attempt's only: the controller may already be starting the next one there.
        self._end_on_host(host, cluster.job, str(rank), 0, False, str(cluster.attempt))

    def terminate(self, job: str, *, grace: float) -> None:
        """End every process of the job on each of its hosts; remove its node dirs."""
        _check_job_name(job)
        hosts = self.job_hosts(job)
        if not hosts:
            return
        distinct = list({(h.address, h.port, h.user): h for h in hosts}.values())
        results = _each(distinct, lambda h: self._end_on_host(h, job, "", grace, True))
        failed = [(host, error) for host, _, error in results if error is not None]
        with self._lock:
            for key in [k for k in self._runtimes if k[0] == job]:
                del self._runtimes[key]
            self._hosts.pop(job, None)
        if failed:
            detail = "; ".join(str(error) for _, error in failed)
            raise SshTeardownError(
                f"job {job}: could not clean up {len(failed)} ssh host(s) (run `trainctl stop "
                f"{job}` again once they are reachable): {detail}"
            )
        self.job_file(job).unlink(missing_ok=True)

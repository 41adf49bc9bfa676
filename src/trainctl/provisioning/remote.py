"""Starting a node's agent on a host reached over SSH, as a detached remote process, plainly
or in the job's image through the host's own engine (pulled there, ECR logged into with the
node's own credentials). Shared by the static SSH provider and the EC2 provider."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainctl.cluster import ClusterInfo, is_loopback
from trainctl.errors import SpecError, TrainctlError, UnrunnableJobError
from trainctl.procs import ATTEMPT_TAG, JOB_TAG, NODE_TAG
from trainctl.provisioning.base import NodeRunner
from trainctl.spec.capacity import SshHost
from trainctl.spec.request import CapacityRequest
from trainctl.spec.settings import get_settings
from trainctl.transport import RunningProcess

AGENT_RUN_DIR = ".agent"  # in a node's root: the agent's log, pid and exit files


class SshProvisionError(TrainctlError):
    """One or more SSH hosts could not be used; nothing was started."""


class ImageCannotRunAgentError(SshProvisionError, UnrunnableJobError):
    """The job's image, on a host, cannot run the agent: no new host would do better."""


# Written by the EC2 nodes' user data when the node is ready (see provisioning.aws.requests).
NODE_PREPARED_MARKER = "/opt/trainctl/node-prepared"


@dataclass
class SshRunner(NodeRunner):
    """The node agent of `rank` as a detached process on a host reached over SSH (an
    SshProcess), plainly or in the job's image through the host's engine.

    What the host was prepared with at provision (the static SSH provider: the agent's
    `runtime_env`, or the image's `engine_path`) is used as is; what was not (an EC2
    instance, which comes up on its own) is done here: wait for its user data to finish
    (`wait_for_marker`), make the node's directories, make sure of the agent of this
    trainctl version or of the image (ECR logged into with the node's own credentials)."""

    # The host, or how to find it when the agent starts (an EC2 instance's address is
    # described then, not when a dry run asks for the runner).
    target: SshHost | Callable[[], SshHost]
    cluster: ClusterInfo
    rank: int
    python: str
    known_hosts: Path
    connect_timeout: float
    image_uri: str | None = None
    request: CapacityRequest | None = None  # the file:// data a loopback container mounts
    host_root: str | None = None  # the node's dir on the host when the agent is in an image
    efa_devices: int = 0
    wait_for_marker: bool = False
    # A new instance may accept connections before its key is installed: retry auth then.
    retry_auth: bool = False
    runtime_env: dict[str, str] | None = None
    engine_path: str | None = None
    # What the provider's nodes always get (EC2's: watch IMDS, halt when orphaned).
    agent_env: dict[str, str] = field(default_factory=dict)

    def start(self, argv: list[str], env: dict[str, str]) -> RunningProcess:
        import time

        from trainctl.transport.bootstrap import ensure_agent
        from trainctl.transport.ssh import SshConnector, SshProcess

        cluster, rank = self.cluster, self.rank
        host = self.target if isinstance(self.target, SshHost) else self.target()
        env = {**self.agent_env, **env}
        connector = SshConnector(host, known_hosts=self.known_hosts)
        started = time.monotonic()
        deadline = started + self.connect_timeout
        timings: dict[str, float] = {}
        conn = connector.connect(timeout=self.connect_timeout, retry_auth=self.retry_auth)
        root = cluster.node(rank).root
        try:
            handed_on = False
            self._wait_for_setup(conn, host, deadline)
            timings["ssh"] = time.monotonic() - started
            host_root = self.host_root or root  # differs from root when in an image
            run_dir = (
                f"/opt/trainctl/run/{cluster.job}/attempt-{cluster.attempt}/node-{rank}"
                if host_root == "/"
                else f"{host_root}/{AGENT_RUN_DIR}"
            )
            mark = time.monotonic()
            engine_path = self.engine_path
            runtime_env = self.runtime_env
            if self.image_uri and engine_path is None:
                # The agent runs in the job's image: the host needs its engine and the image.
                engine_path = remote_engine(conn)
                ecr_login_on_host(conn, engine_path, self.image_uri)
                ensure_remote_image(conn, engine_path, self.image_uri)
                conn.makedirs(f"{host_root.rstrip('/')}/opt/ml")
                timings["image"] = time.monotonic() - mark
            elif not self.image_uri and runtime_env is None:
                conn.makedirs(root)
                runtime_env = ensure_agent(conn, s3=any(a.startswith("s3://") for a in argv)).env
                timings["agent"] = time.monotonic() - mark
            conn.makedirs(run_dir)
            handed_on = True  # the process starts on this very connection and keeps it
            proc: RunningProcess
            if self.image_uri:
                assert engine_path is not None
                proc = start_in_container(
                    connector,
                    self.image_uri,
                    self.request,
                    cluster,
                    rank,
                    argv,
                    env,
                    engine_path=engine_path,
                    host_root=host_root,
                    run_dir=run_dir,
                    gpus=host.gpus,
                    efa_devices=self.efa_devices,
                    connect_timeout=self.connect_timeout,
                    conn=conn,
                )
            else:
                attempt = str(cluster.attempt)
                tags = {JOB_TAG: cluster.job, NODE_TAG: str(rank), ATTEMPT_TAG: attempt}
                proc = SshProcess(
                    connector,
                    argv,
                    {**(runtime_env or {}), **env, **tags},
                    cwd=root,
                    run_dir=run_dir,
                    connect_timeout=self.connect_timeout,
                    conn=conn,
                )
        finally:
            if not handed_on:
                conn.close()
        proc.startup = {k: round(v, 3) for k, v in timings.items()}
        return proc

    def _wait_for_setup(self, conn: Any, host: SshHost, deadline: float) -> None:
        """Until the node's own setup (its user data on EC2) has left its marker."""
        import time

        while self.wait_for_marker and conn.run(["test", "-e", NODE_PREPARED_MARKER]).code:
            if time.monotonic() > deadline:
                raise SshProvisionError(
                    f"{host.address}: the node's setup ({NODE_PREPARED_MARKER}) did "
                    f"not finish within {self.connect_timeout:.0f} s"
                )
            time.sleep(2.0)


def start_in_container(
    connector: Any,
    image_uri: str,
    request: CapacityRequest | None,
    cluster: ClusterInfo,
    rank: int,
    argv: list[str],
    env: dict[str, str],
    *,
    engine_path: str,
    host_root: str,
    run_dir: str,
    gpus: int,
    efa_devices: int,
    connect_timeout: float,
    conn: Any = None,
) -> RunningProcess:
    """The node agent `argv` in the job's image on a host, through the host's engine: the
    same per-node container command as the local provider's, run detached over SSH (on
    `conn` if one is open)."""
    from trainctl.image.container import (
        container_command,
        container_labels,
        container_mounts,
        container_name,
    )
    from trainctl.image.engine import Engine
    from trainctl.transport.ssh import SshProcess

    tags = {JOB_TAG: cluster.job, NODE_TAG: str(rank), ATTEMPT_TAG: str(cluster.attempt)}
    full_env = {**env, **tags}
    command = container_command(
        Engine(Path(engine_path).name, engine_path),
        image_uri,
        name=container_name(cluster.job, cluster.attempt, rank),
        labels=container_labels(cluster.job, cluster.attempt, rank),
        env=set(full_env),
        node_root=host_root,
        agent_argv=argv,
        gpus=gpus,
        efa_devices=efa_devices,
        hosts=cluster.host_entries,
        # file:// locations exist only where the controller is: on a loopback host
        mounts=(
            container_mounts(request, argv)
            if request is not None and is_loopback(cluster.master.address)
            else []
        ),
    )
    return SshProcess(
        connector,
        command,
        full_env,
        cwd=host_root,
        run_dir=run_dir,
        connect_timeout=connect_timeout,
        conn=conn,
    )


def ecr_login_on_host(conn: Any, engine: str, image: str) -> None:
    """Log the host's engine in to the ECR registry of `image` with the node's own
    instance-profile credentials (the AWS CLI on the node), so no credential of the
    submitter's travels; nothing to do for other registries."""
    from trainctl.image.registry import ecr_registry

    ecr = ecr_registry(image)
    if ecr is None:
        return
    registry, region = ecr
    script = (
        f"aws ecr get-login-password --region {shlex.quote(region)} | "
        f"{shlex.quote(engine)} login --username AWS --password-stdin {shlex.quote(registry)}"
    )
    done = conn.run(script, timeout=120)
    if done.code != 0:
        raise SshProvisionError(f"{conn.label}: cannot log in to {registry}: {done.tail(1)}")


def remote_engine(conn: Any) -> str:
    """The path of a container engine that answers on the host (the `container_engine`
    setting's, else docker, else podman); SshProvisionError if there is none."""
    from trainctl.image.engine import ENGINES

    preferred = get_settings().container_engine
    for name in [preferred] if preferred else ENGINES:
        found = conn.run(f"command -v {name}", timeout=30)
        path = found.stdout.strip() if found.code == 0 else ""
        if path and conn.run([path, "info"], timeout=60).code == 0:
            return path
    wanted = preferred or " or ".join(ENGINES)
    raise SshProvisionError(
        f"{conn.label}: the job runs in an image and the host has no {wanted} that answers"
    )


def ensure_remote_image(conn: Any, engine: str, image: str) -> None:
    """Pull `image` on the host unless it is there (plain http only for loopback
    registries, as on this machine), and check that it can run the agent."""
    from trainctl.image.registry import registry_host

    if conn.run([engine, "image", "inspect", image], timeout=60).code != 0:
        tls = []
        if Path(engine).name == "podman" and is_loopback(registry_host(image) or ""):
            tls = ["--tls-verify=false"]
        pulled = conn.run([engine, "pull", *tls, image], timeout=3600)
        if pulled.code != 0:
            raise SshProvisionError(f"{conn.label}: cannot pull {image}: {pulled.tail(1)}")
    check_remote_toolkit(conn, engine, image)


def check_remote_toolkit(conn: Any, engine: str, image: str) -> None:
    """SshProvisionError unless the image can run the agent on the host (see check_toolkit)."""
    from trainctl.image.container import check_toolkit

    def run(argv: list[str]) -> tuple[int, str]:
        done = conn.run(argv, timeout=300)
        return done.code, done.stdout + done.stderr

    try:
        check_toolkit(run, engine, image, where=conn.label)
    except SpecError as exc:
        raise ImageCannotRunAgentError(f"{conn.label}: {exc.message}") from None

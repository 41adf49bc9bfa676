"""Putting a job's controller on another machine: an SSH host or trainctl's EC2 controller
instance (trainctl.spec.controller). The submitter assigns the job to that machine's
controller service through the store, starts the service over SSH if none is serving, and
returns once the job's lease is held: from then on the laptop can close.

The service gets this trainctl (uploaded as for node agents when the host has another
version), the TRAINCTL_* settings in effect and `node_environment`, and nothing else: no
credential of the submitter's. It reaches the store and the cloud with the host's own
(its instance profile on EC2, its own configuration on an SSH host).
"""

from __future__ import annotations

import time
from typing import Any

from trainctl.controller.service import assign, service_is_live
from trainctl.errors import SpecError, TrainctlError
from trainctl.record import JobStore, owner_id
from trainctl.settings import Settings, get_settings
from trainctl.spec.capacity import SshHost
from trainctl.spec.controller import ControllerTarget
from trainctl.store import Store

SERVICE_RUN_DIR = ".trainctl/controllers"  # under the remote home: <id>/log, pid, exit
CONNECT_TIMEOUT = 20.0
# Client packages the service needs beyond the agent's (import name -> pip requirement).
CONTROLLER_DEPENDENCIES = {"fabric": "fabric>=3.2", "paramiko": "paramiko>=3.4"}
# What the controller acts on, passed like the agent's settings (trainctl.controller.plan).
CONTROLLER_SETTINGS = ("heartbeat_timeout_seconds", "stop_grace_seconds", "controller_idle_seconds")


class ControllerStartError(TrainctlError):
    """The remote controller did not take the job; the job stays Pending, nothing runs."""


def check_reachable(target: ControllerTarget) -> None:
    """Preflight: the controller's host accepts us (before anything is uploaded)."""
    if target.kind != "ssh":
        return
    assert target.host is not None
    conn = _connector(target.host).connect(timeout=CONNECT_TIMEOUT)
    conn.close()


def start_remote_controller(store: Store, name: str, target: ControllerTarget) -> dict[str, Any]:
    """Assign job `name` to the target's controller service, start that service if none is
    serving, and wait until it holds the job's lease; returns the lease's holder."""
    from trainctl.controller.lease import view_lease

    settings = get_settings()
    host = _controller_host(store, target)
    jobs = JobStore(store, name)
    assign(store, target.service_id, name, by=owner_id())
    jobs.event("controller_assigned", controller=target.label, service=target.service_id)
    deadline = time.monotonic() + settings.controller_start_timeout_seconds
    started_at: float | None = None
    log_path = ""
    while True:
        lease = view_lease(jobs.read_lease(), settings.lease_seconds)
        if lease.live and lease.holder is not None:
            return lease.holder
        if jobs.load().state.is_terminal():
            return {}
        # Start the service when none serves; again if one that was serving exited (idle)
        # between our assignment and its next look.
        if not service_is_live(store, target.service_id) and (
            started_at is None or time.monotonic() - started_at > settings.lease_seconds
        ):
            log_path = start_service(host, store.uri, target.service_id, settings)
            started_at = time.monotonic()
        if time.monotonic() > deadline:
            raise ControllerStartError(
                f"the controller on {target.label} did not take job {name!r} within "
                f"{settings.controller_start_timeout_seconds:.0f} s"
                + (f" (its log: {host.address}:{log_path})" if log_path else "")
            )
        time.sleep(0.5)


def _controller_host(store: Store, target: ControllerTarget) -> SshHost:
    if target.kind == "ssh":
        assert target.host is not None
        return target.host
    if target.kind == "ec2":
        from trainctl.provisioning.aws.controller import ensure_controller_instance

        return ensure_controller_instance(store.uri, target.service_id)
    raise SpecError("controller", f"{target.label!r} is not a remote controller")


def _connector(host: SshHost) -> Any:
    from trainctl.transport.ssh import SshConnector

    return SshConnector(host, known_hosts=get_settings().home / "known_hosts")


def controller_env(settings: Settings) -> dict[str, str]:
    """The service's environment from here: what an agent gets, plus the controller's own
    settings. No credential: see the module docstring."""
    from trainctl.controller.agents import agent_env

    env = agent_env(settings)
    env.update({f"TRAINCTL_{n.upper()}": str(getattr(settings, n)) for n in CONTROLLER_SETTINGS})
    env.pop("TRAINCTL_STORE", None)  # the service's store is its --store
    return env


def start_service(
    host: SshHost, store_uri: str, service_id: str, settings: Settings, *, on_idle: str = ""
) -> str:
    """Start `python -m trainctl.controller serve` on `host`, detached from this connection
    (it outlives it); returns the path of its log there."""
    from trainctl.transport.bootstrap import ensure_agent
    from trainctl.transport.ssh import SshProcess

    connector = _connector(host)
    conn = connector.connect(timeout=CONNECT_TIMEOUT)
    try:
        runtime = ensure_agent(
            conn, s3=store_uri.startswith("s3://"), extra=CONTROLLER_DEPENDENCIES
        )
        home = conn.home
    finally:
        conn.close()
    run_dir = f"{home}/{SERVICE_RUN_DIR}/{service_id}"
    argv = [host.python, "-m", "trainctl.controller", "serve", "--store", store_uri]
    argv += ["--id", service_id, "--idle-seconds", str(settings.controller_idle_seconds)]
    if on_idle:
        argv += ["--on-idle", on_idle]
    process = SshProcess(
        connector,
        argv,
        {**runtime.env, **controller_env(settings)},
        cwd=home,
        run_dir=run_dir,
        connect_timeout=CONNECT_TIMEOUT,
    )
    process.close()  # the service runs on; its log stays in run_dir
    return f"{run_dir}/log"

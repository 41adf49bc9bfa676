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
from pathlib import Path
from typing import Any

from trainctl.controller.service import assign, service_is_live
from trainctl.errors import SpecError, TrainctlError
from trainctl.record.jobstore import JobStore, owner_id
from trainctl.spec.capacity import SshHost
from trainctl.spec.controller import ControllerTarget
from trainctl.spec.settings import Settings, get_settings
from trainctl.store import Store

SERVICE_RUN_DIR = ".trainctl/controllers"  # under the remote home: <id>/log, pid, exit
CONNECT_TIMEOUT = 20.0
# The preflight of a controller host that is up (not booting): a person waits for it, so a
# refused or silent host is one line within seconds (as `trainctl ui` probes its store).
PREFLIGHT_CONNECT_TIMEOUT = 3.0
PREPARED_MARKER = "/opt/trainctl/controller-prepared"  # written by the EC2 controller's boot
# Client packages the service needs beyond the agent's (import name -> pip requirement).
CONTROLLER_DEPENDENCIES = {"fabric": "fabric>=3.2", "paramiko": "paramiko>=3.4"}
# What the controller acts on, passed like the agent's settings (trainctl.controller.plan).
CONTROLLER_SETTINGS = ("heartbeat_timeout_seconds", "stop_grace_seconds", "controller_idle_seconds")


class ControllerStartError(TrainctlError):
    """The remote controller did not take the job; the job stays Pending, nothing runs."""


def check_reachable(target: ControllerTarget) -> None:
    """Preflight (before anything is uploaded): an SSH controller's host accepts us; an EC2
    controller's instance profile exists."""
    if target.kind == "ec2":
        from trainctl.provisioning.aws.clients import resolve_region
        from trainctl.provisioning.aws.controller import check_controller_profile

        check_controller_profile(resolve_region(target.region))
        return
    if target.kind != "ssh":
        return
    assert target.host is not None
    conn = _connector(target.host).connect(timeout=PREFLIGHT_CONNECT_TIMEOUT)
    conn.close()


def start_remote_controller(store: Store, name: str, target: ControllerTarget) -> dict[str, Any]:
    """Assign job `name` to the target's controller service, start that service if none is
    serving (an EC2 controller: launch or reuse its instance first), and wait until it holds
    the job's lease; returns the lease's holder."""
    from trainctl.controller.lease import view_lease

    settings = get_settings()
    jobs = JobStore(store, name)
    assign(store, target.service_id, name, by=owner_id())
    jobs.event("controller_assigned", controller=target.label, service=target.service_id)
    deadline = time.monotonic() + settings.controller_start_timeout_seconds
    started_at: float | None = None
    where = ""
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
            where = _start_service_for(store, jobs, target, settings)
            started_at = time.monotonic()
        if time.monotonic() > deadline:
            raise ControllerStartError(
                f"the controller on {target.label} did not take job {name!r} within "
                f"{settings.controller_start_timeout_seconds:.0f} s"
                + (f" (its log: {where})" if where else "")
            )
        time.sleep(0.5)


def _start_service_for(
    store: Store, jobs: JobStore, target: ControllerTarget, settings: Settings
) -> str:
    """Start the target's service; returns where its log is ("host:path")."""
    if target.kind == "ssh":
        assert target.host is not None
        log = start_service(target.host, store.uri, target.service_id, settings)
        return f"{target.host.address}:{log}"
    if target.kind != "ec2":
        raise SpecError("controller", f"{target.label!r} is not a remote controller")
    from trainctl.provisioning.aws.controller import ensure_controller_instance

    instance = ensure_controller_instance(store.uri, target.service_id, target.region)
    jobs.event(
        "controller_instance",
        instance_id=instance.instance_id,
        region=instance.region,
        launched=instance.launched,
    )
    log = start_service(
        instance.host,
        store.uri,
        target.service_id,
        settings,
        on_idle=[
            "--on-idle",
            "terminate-instance",
            "--instance-id",
            instance.instance_id,
            "--region",
            instance.region,
        ],
        known_hosts=settings.home / "ssh" / "known_hosts.d" / f"controller-{instance.instance_id}",
        connect_timeout=settings.aws_boot_timeout_seconds,
        wait_for=PREPARED_MARKER if instance.wait_for_marker else None,
    )
    return f"{instance.instance_id} ({instance.host.address}):{log}"


def _connector(host: SshHost, known_hosts: Path | None = None) -> Any:
    from trainctl.transport.ssh import SshConnector

    return SshConnector(host, known_hosts=known_hosts or get_settings().home / "known_hosts")


def controller_env(settings: Settings) -> dict[str, str]:
    """The service's environment from here: what an agent gets, plus the controller's own
    settings. No credential: see the module docstring."""
    from trainctl.controller.agents import agent_env

    env = agent_env(settings)
    env.update({f"TRAINCTL_{n.upper()}": str(getattr(settings, n)) for n in CONTROLLER_SETTINGS})
    env.pop("TRAINCTL_STORE", None)  # the service's store is its --store
    return env


def start_service(
    host: SshHost,
    store_uri: str,
    service_id: str,
    settings: Settings,
    *,
    on_idle: list[str] | None = None,
    known_hosts: Path | None = None,
    connect_timeout: float = CONNECT_TIMEOUT,
    wait_for: str | None = None,
) -> str:
    """Start `python -m trainctl.controller serve` on `host`, detached from this connection
    (it outlives it), once the file `wait_for` exists there (a new instance's first boot);
    returns the path of its log there."""
    from trainctl.transport.bootstrap import ensure_agent
    from trainctl.transport.ssh import SshProcess

    connector = _connector(host, known_hosts)
    deadline = time.monotonic() + connect_timeout
    conn = connector.connect(timeout=connect_timeout, retry_auth=True)
    try:
        while wait_for and conn.run(["test", "-e", wait_for]).code != 0:
            if time.monotonic() > deadline:
                raise ControllerStartError(
                    f"{host.address}: the controller's setup ({wait_for}) did not finish "
                    f"within {connect_timeout:.0f} s"
                )
            time.sleep(2.0)
        runtime = ensure_agent(
            conn, s3=store_uri.startswith("s3://"), extra=CONTROLLER_DEPENDENCIES
        )
        home = conn.home
    finally:
        conn.close()
    run_dir = f"{home}/{SERVICE_RUN_DIR}/{service_id}"
    argv = [host.python, "-m", "trainctl.controller", "serve", "--store", store_uri]
    argv += ["--id", service_id, "--idle-seconds", str(settings.controller_idle_seconds)]
    argv += on_idle or []
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

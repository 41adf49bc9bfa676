"""Where a job's controller runs (`Estimator(controller=...)`, `submit --controller`).

- `local` (the default): this machine, in the submitting process or a detached one.
- `ssh://[user@]host[:port]`: a controller service on a host reached over SSH (its python is
  the `controller_python` setting; keys, users and jump hosts as for `ssh` nodes).
- the name of an `ssh` pool from config.yaml: the service runs on the pool's first host.
- `ec2`: a small on-demand instance trainctl launches (or reuses) in the job's region, with
  an instance profile of its own; the store must then be s3://.

A remote controller is a service that supervises every job assigned to it and exits (an EC2
one terminates its instance) after `controller_idle_seconds` with none.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Literal

from trainctl.errors import SpecError
from trainctl.spec.capacity import POOL_NAME_RE, SshHost, parse_ssh_target

ALLOWED = "'local', 'ec2', 'ssh://[user@]host[:port]' or the name of an ssh pool"


@dataclass(frozen=True)
class ControllerTarget:
    kind: Literal["local", "ssh", "ec2"]
    host: SshHost | None = None  # kind ssh
    label: str = "local"  # what the user wrote, for messages
    region: str | None = None  # kind ec2: the job's region (None: the default one)
    store_uri: str = ""  # kind ec2: one controller instance per region and store

    @property
    def remote(self) -> bool:
        return self.kind != "local"

    @property
    def service_id(self) -> str:
        """The service's name in the store (controllers/<id>/): one per host or region."""
        if self.kind == "ssh":
            assert self.host is not None
            user = f"{self.host.user}@" if self.host.user else ""
            raw = f"ssh-{user}{self.host.address}-{self.host.port}"
        elif self.kind == "ec2":
            store = hashlib.sha256(self.store_uri.encode()).hexdigest()[:8]
            raw = f"ec2-{self.region or 'default-region'}-{store}"
        else:
            raw = self.kind
        return re.sub(r"[^A-Za-z0-9_.@-]", "-", raw)


def check_controller(value: str) -> str:
    """The syntax check (the JobSpec field validator): no settings are read here."""
    if value in ("local", "ec2") or POOL_NAME_RE.fullmatch(value):
        return value
    if value.startswith("ssh://"):
        try:
            parse_ssh_target(value.removeprefix("ssh://").rstrip("/"))
        except ValueError:
            pass
        else:
            return value
    raise ValueError(f"{value!r} is not a controller: use {ALLOWED}")


def controller_target(
    value: str, *, store_uri: str | None = None, region: str | None = None
) -> ControllerTarget:
    """Resolve a job's `controller` field against the settings (pools, controller_python);
    errors name the field and what is allowed. `store_uri` is the job's store: an ec2
    controller cannot reach a file:// one."""
    from trainctl.spec.settings import get_settings

    settings = get_settings()
    if value == "local":
        return ControllerTarget("local")
    if value == "ec2":
        if store_uri is not None and not store_uri.startswith("s3://"):
            raise SpecError(
                "controller",
                f"'ec2' runs the controller on an EC2 instance, which cannot reach the store "
                f"{store_uri}: set TRAINCTL_STORE to an s3:// URI",
            )
        return ControllerTarget("ec2", label="ec2", region=region, store_uri=store_uri or "")
    if value.startswith("ssh://"):
        try:
            target = parse_ssh_target(value.removeprefix("ssh://").rstrip("/"))
        except ValueError as exc:
            raise SpecError("controller", f"{value!r}: {exc}") from None
        ssh_host = SshHost(
            address=target.address,
            port=target.port or 22,
            user=target.user,
            python=settings.controller_python or "python3",
        )
        return ControllerTarget("ssh", ssh_host, value)
    if not POOL_NAME_RE.fullmatch(value):
        raise SpecError("controller", f"{value!r} is not a controller: use {ALLOWED}")
    pool = settings.pools.get(value)
    if pool is None:
        configured = ", ".join(sorted(settings.pools)) or "none configured"
        raise SpecError(
            "controller", f"no pool named {value!r} (pools: {configured}); use {ALLOWED}"
        )
    if pool.provider != "ssh" or not pool.hosts:
        raise SpecError(
            "controller",
            f"pool {value!r} is a {pool.provider} pool: a controller pool must be an ssh pool "
            "with hosts (the controller runs on its first host)",
        )
    return ControllerTarget("ssh", pool.hosts[0], value)

"""Where a job's nodes come from: resource pools, SSH host lists, EC2 capacity options.

Pools are named capacity configs in `$TRAINCTL_HOME/config.yaml` (as in Determined)::

    pools:
      gpu-spot:
        provider: aws
        region: us-east-1
        instance_types: [p3.16xlarge, p3.8xlarge]   # fallback order
        use_spot_instances: true
        on_demand_fallback: true
        subnets: [subnet-0abc, subnet-0def]          # fallback order (one AZ each)
        instance_profile: trainctl-node
        max_instances: 8
      lab:
        provider: ssh
        hosts:
          - {address: 10.0.0.5, user: ubuntu, key_file: ~/.ssh/lab, gpus: 8}

A job names a pool (`Estimator(pool=...)`, `--pool`); its own fields override the pool's.
`build_spec` resolves the pool into the job spec, so a job's record says exactly what
capacity it asked for even if the pool is edited later. Only pydantic here: settings, spec
and providers all import it.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal, NamedTuple

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from trainctl.spec.limits import MAX_INSTANCE_COUNT

REGION_RE = re.compile(r"^[a-z]{2}(-gov)?-[a-z]+-[0-9]$")
SUBNET_RE = re.compile(r"^subnet-[0-9a-f]{8,17}$")
SECURITY_GROUP_RE = re.compile(r"^sg-[0-9a-f]{8,17}$")
AMI_RE = re.compile(r"^ami-[0-9a-f]{8,17}$")
SSM_PARAMETER_PREFIX = "resolve:ssm:"
POOL_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class SshHost(_Strict):
    """A machine the user already has, reached over SSH (`instance_type="ssh"`)."""

    address: str = Field(min_length=1, max_length=253)
    port: int = Field(default=22, ge=1, le=65535)
    user: str | None = Field(default=None, min_length=1, max_length=64)
    key_file: str | None = None
    gpus: int = Field(default=0, ge=0, le=64)
    python: str = Field(default="python3", min_length=1)
    # Pinned host key ("ssh-ed25519 AAAA..."): without it the first key seen is pinned
    # in $TRAINCTL_HOME/known_hosts and a changed key is refused.
    host_key: str | None = None
    # Jump host(s), OpenSSH ProxyJump syntax: "[user@]bastion[:port][,[user@]next...]"; each
    # hop's host key is pinned like the host's. Without it: the ssh_proxy_jump setting, else
    # ~/.ssh/config's ProxyJump for the address, else a direct connection.
    proxy_jump: str | None = None

    @field_validator("proxy_jump")
    @classmethod
    def _proxy_jump(cls, v: str | None) -> str | None:
        return check_proxy_jump(v)

    @field_validator("address")
    @classmethod
    def _address(cls, v: str) -> str:
        if any(c.isspace() for c in v) or v.startswith("-"):
            raise ValueError(f"{v!r} is not a host name or IP address")
        return v


# OpenSSH's `[user@]host[:port]` (an IPv6 address in brackets): --hosts, each ProxyJump
# hop and an ssh:// controller are read by this one parser.
SSH_TARGET_RE = re.compile(
    r"^(?:(?P<user>[A-Za-z0-9_][A-Za-z0-9_.-]{0,63})@)?"
    r"(?P<host>[A-Za-z0-9_.][A-Za-z0-9_.-]{0,252}|\[[0-9A-Fa-f:]+\])(?::(?P<port>[0-9]{1,5}))?$"
)


class SshTarget(NamedTuple):
    user: str | None
    address: str  # without IPv6 brackets
    port: int | None  # None: not given (22, or the host's own setting)


def parse_ssh_target(text: str) -> SshTarget:
    """`[user@]host[:port]` into its parts; ValueError naming what is allowed."""
    match = SSH_TARGET_RE.fullmatch(text.strip())
    port = int(match["port"]) if match and match["port"] else None
    if match is None or (port is not None and not 1 <= port <= 65535):
        raise ValueError(f"{text.strip()!r} is not [user@]host[:port] (a port is 1-65535)")
    return SshTarget(match["user"], match["host"].strip("[]"), port)


def check_proxy_jump(v: str | None) -> str | None:
    """'[user@]host[:port]' hops joined by commas (OpenSSH's ProxyJump), or 'none'."""
    if v is None or v.strip().lower() == "none":
        return v
    for hop in v.split(","):
        try:
            parse_ssh_target(hop)
        except ValueError:
            raise ValueError(
                f"{hop.strip()!r} is not a jump host; use [user@]host[:port], several "
                "joined by commas"
            ) from None
    return v


def check_region(v: str | None) -> str | None:
    if v is not None and not REGION_RE.fullmatch(v):
        raise ValueError(f"{v!r} is not an AWS region name like us-east-1")
    return v


def check_image_id(v: str | None) -> str | None:
    if v is None:
        return v
    if AMI_RE.fullmatch(v) or (v.startswith(SSM_PARAMETER_PREFIX) and len(v) > 13):
        return v
    raise ValueError(f"{v!r} is neither an AMI id (ami-...) nor resolve:ssm:<parameter name>")


def check_ids(values: list[str], pattern: re.Pattern[str], what: str) -> list[str]:
    for v in values:
        if not pattern.fullmatch(v):
            raise ValueError(f"{v!r} is not a {what} id")
    if len(set(values)) != len(values):
        raise ValueError("lists an id twice")
    return values


def _instance_types(values: list[str]) -> list[str]:
    from trainctl.spec.catalog import check_instance_type

    for name in values:
        check_instance_type(name)
    return values


# Typed fields shared by pools and job specs: one rule, one wording of each error.
Region = Annotated[str | None, AfterValidator(check_region)]
ImageId = Annotated[str | None, AfterValidator(check_image_id)]
# A KMS key as EC2 and S3 take it: an id, alias/NAME or an ARN
KmsKeyId = Annotated[
    str | None, Field(min_length=1, max_length=2048, pattern=r"^[A-Za-z0-9:/_.\-]+$")
]
SubnetIds = Annotated[list[str], AfterValidator(lambda v: check_ids(v, SUBNET_RE, "subnet"))]
SecurityGroupIds = Annotated[
    list[str], AfterValidator(lambda v: check_ids(v, SECURITY_GROUP_RE, "security group"))
]
InstanceTypes = Annotated[list[str], AfterValidator(_instance_types)]


class PoolConfig(_Strict):
    """One named pool in config.yaml; every field a job may also set itself."""

    provider: Literal["local", "aws", "ssh"]
    region: Region = None
    instance_types: InstanceTypes = Field(default_factory=list)
    use_spot_instances: bool = False
    on_demand_fallback: bool = False
    subnets: SubnetIds = Field(default_factory=list)
    security_group_ids: SecurityGroupIds = Field(default_factory=list)
    image_id: ImageId = None
    instance_profile: str | None = None
    volume_size: int | None = Field(default=None, ge=8, le=16384)
    max_instances: int | None = Field(default=None, ge=1, le=MAX_INSTANCE_COUNT)
    keep_alive_period_in_seconds: int | None = Field(default=None, ge=0, le=3600)
    hosts: list[SshHost] = Field(default_factory=list)

"""Pure builders of the EC2 requests the provider sends: the dry run shows these very dicts.

Nothing here calls AWS or imports boto3. `provision` resolves a `LaunchContext` (image, VPC,
owner, security group...) with real calls and passes it to the same builders the dry run
uses with placeholders, so the two cannot drift apart.
"""

from __future__ import annotations

import hashlib
import shlex
from dataclasses import dataclass
from typing import Any

from trainctl.spec.catalog import CATALOG
from trainctl.spec.request import CapacityRequest

TAG_JOB = "trainctl:job"
TAG_ATTEMPT = "trainctl:attempt"
TAG_OWNER = "trainctl:owner"
TAG_RANK = "trainctl:rank"

SPOT = "spot"
ON_DEMAND = "on-demand"

# Families whose EFA does GPUDirect RDMA; AWS's own launcher (sagemaker-training-toolkit) sets
# FI_EFA_USE_DEVICE_RDMA=1 for exactly these.
RDMA_FAMILIES = frozenset({"p4d", "p4de", "p5"})

METADATA_OPTIONS = {
    "HttpTokens": "required",
    "HttpPutResponseHopLimit": 2,
    "HttpEndpoint": "enabled",
}
SSH_PORT = 22

# Placeholders of the dry run: values that exist only once provision has made its calls.
SECURITY_GROUP_PLACEHOLDER = "<security-group-id>"
DEFAULT_SUBNET_PLACEHOLDER = "<default subnet of each AZ of the default VPC, in turn>"


def instance_id_placeholder(rank: int) -> str:
    return f"<instance id of rank {rank}>"


@dataclass(frozen=True)
class LaunchContext:
    """Everything the requests of one attempt depend on beyond the request."""

    job: str
    attempt: int
    region: str
    owner: str
    image_id: str
    root_device_name: str
    vpc_id: str
    ssh_cidr: str
    public_key: str  # the OpenSSH public key line, or a placeholder in a dry run
    ssh_user: str
    security_group_ids: tuple[str, ...] = ()
    placement_group: str | None = None
    # Instances of this attempt launched before (then ended): part of the ClientToken, so a
    # relaunch is a new request and not a replay of the first one (tokens outlive instances).
    launched_before: int = 0


@dataclass(frozen=True)
class LaunchChoice:
    """One way to get the capacity: a market, an instance type and a subnet (one AZ)."""

    market: str
    instance_type: str
    subnet: str

    def describe(self) -> str:
        return f"{self.instance_type} {self.market} in {self.subnet}"


def resource_name(job: str) -> str:
    """Name of the job's security group, placement group and key pair."""
    return f"trainctl-{job}"


def instance_name(job: str, attempt: int, rank: int | None = None) -> str:
    base = f"trainctl-{job}-{attempt}"
    return base if rank is None else f"{base}-algo-{rank + 1}"


def launch_choices(request: CapacityRequest, subnets: list[str]) -> list[LaunchChoice]:
    """The order capacity is tried in: each subnet, then each type, then (optionally) on-demand."""
    markets = [SPOT, ON_DEMAND] if request.on_demand_fallback else [SPOT]
    if not request.use_spot_instances:
        markets = [ON_DEMAND]
    return [
        LaunchChoice(market, instance_type, subnet)
        for market in markets
        for instance_type in request.instance_types
        for subnet in subnets
    ]


def uses_placement_group(request: CapacityRequest, enabled: bool = True) -> bool:
    """A cluster placement group for a multi-node job, unless the setting turns it off."""
    return enabled and request.instance_count > 1


def efa_interfaces(instance_type: str) -> int:
    return CATALOG[instance_type].efa_interfaces


def network_env(instance_type: str) -> dict[str, str]:
    """Environment of every node for NCCL/EFA on this instance type (ClusterInfo.network_env).

    NCCL may pick any interface but the loopback and docker's bridge (the DLAMI has docker);
    with EFA, libfabric's efa provider, and RDMA where the hardware has it.
    """
    env = {"NCCL_SOCKET_IFNAME": "^lo,docker"}
    if efa_interfaces(instance_type):
        env["FI_PROVIDER"] = "efa"
        # EFA registers memory for RDMA; a fork (DataLoader workers) must not corrupt it.
        env["RDMAV_FORK_SAFE"] = "1"
        if instance_type.split(".")[0] in RDMA_FAMILIES:
            env["FI_EFA_USE_DEVICE_RDMA"] = "1"
    return env


def base_tags(ctx: LaunchContext, name: str) -> list[dict[str, str]]:
    return [
        {"Key": TAG_JOB, "Value": ctx.job},
        {"Key": TAG_ATTEMPT, "Value": str(ctx.attempt)},
        {"Key": TAG_OWNER, "Value": ctx.owner},
        {"Key": "Name", "Value": name},
    ]


def tag_spec(resource_type: str, tags: list[dict[str, str]]) -> dict[str, Any]:
    return {"ResourceType": resource_type, "Tags": tags}


def create_security_group(ctx: LaunchContext) -> dict[str, Any]:
    name = resource_name(ctx.job)
    return {
        "GroupName": name,
        "Description": f"trainctl job {ctx.job}: all traffic between its nodes, SSH from the "
        "submitter",
        "VpcId": ctx.vpc_id,
        "TagSpecifications": [tag_spec("security-group", base_tags(ctx, name))],
    }


def authorize_ingress(ctx: LaunchContext, group_id: str) -> dict[str, Any]:
    """All traffic from the group itself (torchrun, NCCL, EFA); SSH only from `ssh_cidr`."""
    ssh: dict[str, Any] = {"IpProtocol": "tcp", "FromPort": SSH_PORT, "ToPort": SSH_PORT}
    description = "SSH from the trainctl submitter"
    if ":" in ctx.ssh_cidr:
        ssh["Ipv6Ranges"] = [{"CidrIpv6": ctx.ssh_cidr, "Description": description}]
    else:
        ssh["IpRanges"] = [{"CidrIp": ctx.ssh_cidr, "Description": description}]
    return {
        "GroupId": group_id,
        "IpPermissions": [
            {
                "IpProtocol": "-1",
                "UserIdGroupPairs": [
                    {"GroupId": group_id, "Description": "all traffic between the job's nodes"}
                ],
            },
            ssh,
        ],
        "TagSpecifications": [
            tag_spec("security-group-rule", base_tags(ctx, resource_name(ctx.job)))
        ],
    }


def create_placement_group(ctx: LaunchContext) -> dict[str, Any]:
    name = resource_name(ctx.job)
    return {
        "GroupName": name,
        "Strategy": "cluster",
        "TagSpecifications": [tag_spec("placement-group", base_tags(ctx, name))],
    }


def import_key_pair(ctx: LaunchContext) -> dict[str, Any]:
    name = resource_name(ctx.job)
    return {
        "KeyName": name,
        "PublicKeyMaterial": ctx.public_key,
        "TagSpecifications": [tag_spec("key-pair", base_tags(ctx, name))],
    }


def instance_profile(value: str) -> dict[str, str]:
    return {"Arn": value} if value.startswith("arn:") else {"Name": value}


def instance_profile_name(value: str) -> str:
    """The profile's name, from a name or an ARN (arn:aws:iam::1:instance-profile/path/name)."""
    return value.rsplit("/", 1)[-1] if value.startswith("arn:") else value


def user_data(ssh_user: str) -> str:
    """The node's first-boot script. No secret: nodes get credentials from their profile."""
    user = shlex.quote(ssh_user)
    return f"""#!/bin/bash
# trainctl node preparation. Holds no secret: the node reaches the store with its instance
# profile; the node agent is started later over SSH.
set -euo pipefail
mkdir -p /opt/ml /opt/trainctl
chown {user}: /opt/ml /opt/trainctl
if ! command -v python3 >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3 python3-venv
  elif command -v dnf >/dev/null 2>&1; then
    dnf install -y -q python3
  else
    yum install -y -q python3
  fi
fi
touch /opt/trainctl/node-prepared
"""


def client_token(
    job: str, attempt: int, choice: LaunchChoice, round_: int, launched_before: int = 0
) -> str:
    """RunInstances idempotency token: a retried request (botocore's own retries) launches
    nothing twice. The round is part of it: after a capacity error the same choice is asked
    again in a later round, and that must be a new request, not the failed one replayed."""
    if choice.subnet.startswith("<"):
        return "<ClientToken: hash of job, attempt, market, type, subnet and round>"
    key = (
        f"{job}|{attempt}|{choice.market}|{choice.instance_type}|{choice.subnet}|{round_}"
        f"|{launched_before}"
    )
    return "trainctl-" + hashlib.sha256(key.encode()).hexdigest()[:40]


def run_instances(
    ctx: LaunchContext, request: CapacityRequest, choice: LaunchChoice, round_: int = 1
) -> dict[str, Any]:
    """The RunInstances request of one launch choice: all nodes or none (MinCount=MaxCount)."""
    name = instance_name(ctx.job, ctx.attempt)
    tags = base_tags(ctx, name) + [{"Key": k, "Value": v} for k, v in request.aws.tags.items()]
    resource_types = ["instance", "volume", "network-interface"]
    if choice.market == SPOT:
        resource_types.append("spot-instances-request")
    params: dict[str, Any] = {
        "ImageId": ctx.image_id,
        "InstanceType": choice.instance_type,
        "MinCount": request.instance_count,
        "MaxCount": request.instance_count,
        "ClientToken": client_token(ctx.job, ctx.attempt, choice, round_, ctx.launched_before),
        "KeyName": resource_name(ctx.job),
        "IamInstanceProfile": instance_profile(request.aws.instance_profile or ""),
        "MetadataOptions": dict(METADATA_OPTIONS),
        "BlockDeviceMappings": [
            {
                "DeviceName": ctx.root_device_name,
                "Ebs": {
                    "VolumeSize": request.aws.root_volume_gb,
                    "VolumeType": "gp3",
                    "Encrypted": True,
                    **({"KmsKeyId": kms} if (kms := request.aws.volume_kms_key) else {}),
                    "DeleteOnTermination": True,
                },
            }
        ],
        "UserData": user_data(ctx.ssh_user),
        "InstanceInitiatedShutdownBehavior": "terminate",
        "TagSpecifications": [tag_spec(t, tags) for t in resource_types],
    }
    efa = efa_interfaces(choice.instance_type)
    if efa:
        # With EFA the groups and subnet belong to each interface, never to the request.
        interfaces = []
        for card in range(efa):
            interface: dict[str, Any] = {
                "NetworkCardIndex": card,
                "DeviceIndex": 0 if card == 0 else 1,
                "InterfaceType": "efa",
                "SubnetId": choice.subnet,
                "Groups": list(ctx.security_group_ids),
                "DeleteOnTermination": True,
            }
            interfaces.append(interface)
        params["NetworkInterfaces"] = interfaces
    else:
        params["SubnetId"] = choice.subnet
        params["SecurityGroupIds"] = list(ctx.security_group_ids)
    if ctx.placement_group:
        params["Placement"] = {"GroupName": ctx.placement_group}
    if choice.market == SPOT:
        params["InstanceMarketOptions"] = {
            "MarketType": "spot",
            "SpotOptions": {
                "SpotInstanceType": "one-time",
                "InstanceInterruptionBehavior": "terminate",
            },
        }
    return params


def rank_tags(ctx: LaunchContext, instance_id: str, rank: int) -> dict[str, Any]:
    """Per-instance tags set after launch, in rank order (sorted by AmiLaunchIndex)."""
    return {
        "Resources": [instance_id],
        "Tags": [
            {"Key": TAG_RANK, "Value": str(rank)},
            {"Key": "Name", "Value": instance_name(ctx.job, ctx.attempt, rank)},
        ],
    }


def request(
    operation: str, params: dict[str, Any], region: str, *, service: str = "ec2", **extra: Any
) -> dict[str, Any]:
    """One entry of a dry run: {"service", "operation", "params"} plus where and when."""
    return {"service": service, "operation": operation, "params": params, "region": region, **extra}

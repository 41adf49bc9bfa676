"""trainctl's own EC2 controller instance (`controller="ec2"`): one small on-demand instance
per region and store, which runs the controller service for every job assigned to it and
terminates itself after `controller_idle_seconds` with none.

It is found again by its tags (`trainctl:job=controller-ec2-<region>-<store hash>`), so a
second submit reuses it. Its resources (security group: SSH from
the submitter only; key pair: trainctl's key) are tagged like a job's, so `trainctl gc` finds
them, and judges them by the service's lease in the store rather than by a job record.

It reaches the store and EC2 with its instance profile (`controller_instance_profile`); no
credential of the submitter's is copied to it. `controller_policy(store_uri)` is the policy
that profile's role needs.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

from trainctl.errors import SpecError
from trainctl.provisioning.aws import requests as rq
from trainctl.provisioning.aws import resources
from trainctl.provisioning.aws.capacity import wait_running
from trainctl.provisioning.aws.clients import (
    AwsError,
    Clients,
    Timing,
    error_code,
    resolve_region,
    tags_of,
)
from trainctl.provisioning.aws.keys import default_key_path, ensure_key
from trainctl.provisioning.aws.lookups import caller_name, resolve_image, resolve_network
from trainctl.provisioning.aws.preflight import check_ssh_cidr
from trainctl.spec.capacity import SshHost
from trainctl.spec.settings import get_settings

CONTROLLER_JOB_PREFIX = "controller-"
TAG_STORE = "trainctl:store"
TAG_ROLE = "trainctl:role"
VENV_PYTHON = "/opt/trainctl/venv/bin/python"
PREPARED_MARKER = "/opt/trainctl/controller-prepared"  # as trainctl.controller.remote waits for
VOLUME_GB = 16


def controller_job(service_id: str) -> str:
    """The `trainctl:job` tag value of a controller's resources."""
    return f"{CONTROLLER_JOB_PREFIX}{service_id}"


def is_controller_job(name: str) -> bool:
    return name.startswith(CONTROLLER_JOB_PREFIX + "ec2-")


def service_of(job: str) -> str:
    return job[len(CONTROLLER_JOB_PREFIX) :]


def store_tag(store_uri: str) -> str:
    return hashlib.sha256(store_uri.encode()).hexdigest()[:16]


def controller_python() -> str:
    return get_settings().controller_python or VENV_PYTHON


def user_data(ssh_user: str) -> str:
    """First boot: python with venv and pip (the service's dependencies are installed into
    it over SSH, as for node agents). No secret."""
    user = ssh_user.replace("'", "")
    return f"""#!/bin/bash
# trainctl controller preparation. Holds no secret: the controller reaches the store and EC2
# with its instance profile; its service is started later over SSH.
set -euo pipefail
mkdir -p /opt/trainctl
if command -v apt-get >/dev/null 2>&1; then
  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3 python3-venv
elif command -v dnf >/dev/null 2>&1; then
  dnf install -y -q python3
else
  yum install -y -q python3
fi
python3 -m venv /opt/trainctl/venv
chown -R '{user}': /opt/trainctl
touch {PREPARED_MARKER}
"""


def run_instances(ctx: rq.LaunchContext, subnet: str, store_uri: str) -> dict[str, Any]:
    """The RunInstances request of the controller: one on-demand instance."""
    settings = get_settings()
    tags = [
        *rq.base_tags(ctx, rq.resource_name(ctx.job)),
        {"Key": TAG_STORE, "Value": store_tag(store_uri)},
        {"Key": TAG_ROLE, "Value": "controller"},
    ]
    return {
        "ImageId": ctx.image_id,
        "InstanceType": settings.controller_instance_type,
        "MinCount": 1,
        "MaxCount": 1,
        "KeyName": rq.resource_name(ctx.job),
        "IamInstanceProfile": rq.instance_profile(settings.controller_instance_profile),
        "MetadataOptions": dict(rq.METADATA_OPTIONS),
        "BlockDeviceMappings": [
            {
                "DeviceName": ctx.root_device_name,
                "Ebs": {
                    "VolumeSize": VOLUME_GB,
                    "VolumeType": "gp3",
                    "Encrypted": True,
                    "DeleteOnTermination": True,
                },
            }
        ],
        "UserData": user_data(ctx.ssh_user),
        # The service halts the machine when idle; halting must not leave a stopped one.
        "InstanceInitiatedShutdownBehavior": "terminate",
        "SubnetId": subnet,
        "SecurityGroupIds": list(ctx.security_group_ids),
        "TagSpecifications": [
            rq.tag_spec(kind, tags) for kind in ("instance", "volume", "network-interface")
        ],
    }


@dataclasses.dataclass(frozen=True)
class ControllerInstance:
    instance_id: str
    region: str
    host: SshHost
    launched: bool  # by this call
    wait_for_marker: bool  # its user data may still run


def find_controller_instance(ec2: Any, service_id: str, store_uri: str) -> dict[str, Any] | None:
    filters = [
        {"Name": f"tag:{rq.TAG_JOB}", "Values": [controller_job(service_id)]},
        {"Name": f"tag:{TAG_STORE}", "Values": [store_tag(store_uri)]},
        {"Name": "instance-state-name", "Values": ["pending", "running"]},
    ]
    found = resources.describe_instances(ec2, filters=filters)
    return sorted(found, key=lambda i: str(i.get("LaunchTime", "")))[-1] if found else None


def check_controller_profile(region: str) -> None:
    """Preflight: the controller's instance profile exists and has a role."""
    name = rq.instance_profile_name(get_settings().controller_instance_profile)
    iam = Clients()("iam", region)
    try:
        profile = iam.get_instance_profile(InstanceProfileName=name)["InstanceProfile"]
    except Exception as exc:
        code = error_code(exc)
        if code == "NoSuchEntity":
            raise SpecError(
                "controller",
                f"'ec2': the controller's instance profile {name!r} does not exist; create it "
                "with the policy `trainctl controller-policy` prints, or set "
                "TRAINCTL_CONTROLLER_INSTANCE_PROFILE",
            ) from None
        if code in ("AccessDenied", "AccessDeniedException"):
            return
        raise
    if not profile.get("Roles"):
        raise SpecError("controller", f"'ec2': instance profile {name!r} has no role")


def ensure_controller_instance(store_uri: str, service_id: str, region: str) -> ControllerInstance:
    """The running controller instance of this region and store, launched if there is none."""
    settings = get_settings()
    region = resolve_region(region)
    clients = Clients()
    ec2 = clients("ec2", region)
    timing = Timing()
    existing = find_controller_instance(ec2, service_id, store_uri)
    launched = existing is None
    if existing is None:
        job = controller_job(service_id)
        image = resolve_image(
            ec2,
            clients("ssm", region),
            settings.controller_image or settings.aws_default_image,
            region,
        )
        network = resolve_network(ec2, [], region)
        check_ssh_cidr(settings.aws_ssh_cidr)
        from trainctl.provisioning.aws.provider import public_address

        ctx = rq.LaunchContext(
            job=job,
            attempt=1,
            region=region,
            owner=caller_name(clients("sts", region)),
            image_id=image.image_id,
            root_device_name=image.root_device_name,
            vpc_id=network.vpc_id,
            ssh_cidr=settings.aws_ssh_cidr or public_address(),
            public_key=ensure_key(default_key_path()),
            ssh_user=settings.ssh_user,
        )
        group_id = resources.ensure_security_group(ec2, ctx)
        ctx = dataclasses.replace(ctx, security_group_ids=(group_id,))
        resources.ensure_key_pair(ec2, ctx)
        params = run_instances(ctx, network.subnets[0], store_uri)
        existing = ec2.run_instances(**params)["Instances"][0]
    instance_id = str(existing["InstanceId"])
    instance = wait_running(ec2, [instance_id], timing, settings.aws_boot_timeout_seconds)[0]
    override = settings.controller_ssh_address_override
    if override:
        from trainctl.provisioning.aws.provider import parse_override

        address, port = parse_override(override)
    else:
        public = None if settings.ssh_proxy_jump else instance.get("PublicIpAddress")
        address, port = str(public or instance.get("PrivateIpAddress")), 22
    host = SshHost(
        address=address,
        port=port,
        user=settings.ssh_user,
        key_file=str(default_key_path()),
        python=controller_python(),
    )
    return ControllerInstance(instance_id, region, host, launched, not override)


def terminate_own_instance(instance_id: str, region: str) -> None:
    """What an idle EC2 controller does last: end its own machine (its instance profile
    allows TerminateInstances on instances tagged as trainctl's)."""
    ec2 = Clients()("ec2", region)
    instance = next(iter(resources.describe_instances(ec2, ids=[instance_id])), None)
    if instance is None or tags_of(instance).get(TAG_ROLE) != "controller":
        raise AwsError(f"{instance_id} is not a trainctl controller instance: not terminated")
    resources.terminate_instances(ec2, [instance_id])


def controller_policy(store_uri: str) -> dict[str, Any]:
    """The IAM policy of the controller's role: run and end trainctl's EC2 resources (tagged
    trainctl:*), pass the nodes' instance profile role, and read and write the store."""
    from trainctl.spec.uris import split_s3_uri

    bucket, prefix = split_s3_uri(store_uri)
    objects = f"arn:aws:s3:::{bucket}/{prefix.strip('/') + '/' if prefix.strip('/') else ''}*"
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "TrainctlEc2",
                "Effect": "Allow",
                "Action": [
                    "ec2:RunInstances",
                    "ec2:TerminateInstances",
                    "ec2:CreateTags",
                    "ec2:Describe*",
                    "ec2:CreateSecurityGroup",
                    "ec2:AuthorizeSecurityGroupIngress",
                    "ec2:DeleteSecurityGroup",
                    "ec2:CreatePlacementGroup",
                    "ec2:DeletePlacementGroup",
                    "ec2:ImportKeyPair",
                    "ec2:DeleteKeyPair",
                    "ec2:DeleteVolume",
                    "ec2:DeleteNetworkInterface",
                    "ssm:GetParameter",
                    "ssm:GetParameters",
                    "sts:GetCallerIdentity",
                    "pricing:GetProducts",
                    "ec2:GetSpotPlacementScores",  # asked before a try back to spot
                ],
                "Resource": "*",
            },
            {
                "Sid": "TrainctlPassNodeRole",
                "Effect": "Allow",
                "Action": "iam:PassRole",
                "Resource": "*",
                "Condition": {"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}},
            },
            {
                "Sid": "TrainctlReadProfiles",
                "Effect": "Allow",
                "Action": ["iam:GetInstanceProfile"],
                "Resource": "*",
            },
            {
                "Sid": "TrainctlStore",
                "Effect": "Allow",
                "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"],
                "Resource": objects,
            },
            {
                "Sid": "TrainctlStoreList",
                "Effect": "Allow",
                "Action": "s3:ListBucket",
                "Resource": f"arn:aws:s3:::{bucket}",
            },
        ],
    }

"""Read-only lookups shared by preflight and provision: image, network, caller identity.

Each failure that bad input explains is a one-line SpecError naming the field.
"""

from __future__ import annotations

import getpass
import os
import re
from dataclasses import dataclass
from typing import Any

from trainctl.errors import SpecError
from trainctl.provisioning.aws.clients import error_code, error_message
from trainctl.spec.capacity import AMI_RE, SSM_PARAMETER_PREFIX

_ACCESS_KEY_RE = re.compile(r"\b(?:AKIA|ASIA|AIDA|AROA|AIPA|ANPA|ANVA|AGPA)[A-Z0-9]{12,}\b")
REDACTED = "<redacted>"


def scrub(text: str) -> str:
    """`text` without access key ids or the secret values of this environment."""
    for name in ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID"):
        value = os.environ.get(name)
        if value and len(value) >= 8:
            text = text.replace(value, REDACTED)
    return _ACCESS_KEY_RE.sub(REDACTED, text)


@dataclass(frozen=True)
class Image:
    image_id: str
    root_device_name: str
    architecture: str


@dataclass(frozen=True)
class Network:
    vpc_id: str
    subnets: list[str]  # in fallback order
    zones: dict[str, str]  # subnet -> availability zone


def image_source(image: str) -> str:
    """How the image is named, for messages: the AMI id or the SSM parameter."""
    if image.startswith(SSM_PARAMETER_PREFIX):
        return f"SSM parameter {image[len(SSM_PARAMETER_PREFIX) :]}"
    return image


def resolve_image(ec2: Any, ssm: Any, image: str, region: str) -> Image:
    """An AMI id or resolve:ssm:<parameter> -> the image, checked to exist in `region`."""
    image_id = image
    if image.startswith(SSM_PARAMETER_PREFIX):
        name = image[len(SSM_PARAMETER_PREFIX) :]
        try:
            image_id = str(ssm.get_parameter(Name=name)["Parameter"]["Value"]).strip()
        except Exception as exc:
            if error_code(exc) in ("ParameterNotFound", "ValidationException"):
                raise SpecError("image_id", f"SSM parameter {name} not found in {region}") from None
            raise
        if not AMI_RE.fullmatch(image_id):
            raise SpecError("image_id", f"SSM parameter {name} holds {image_id!r}, not an AMI id")
    try:
        images = ec2.describe_images(ImageIds=[image_id])["Images"]
    except Exception as exc:
        if error_code(exc) in (
            "InvalidAMIID.NotFound",
            "InvalidAMIID.Malformed",
            "InvalidAMIID.Unavailable",
        ):
            images = []
        else:
            raise
    if not images:
        via = "" if image_id == image else f" (from {image_source(image)})"
        raise SpecError("image_id", f"image {image_id}{via} not found in {region}")
    found = images[0]
    return Image(
        image_id=image_id,
        root_device_name=str(found.get("RootDeviceName") or "/dev/sda1"),
        architecture=str(found.get("Architecture") or "x86_64"),
    )


def resolve_network(ec2: Any, subnets: list[str], region: str) -> Network:
    """The VPC and subnets a job launches into: the given subnets (one VPC), else the
    default subnet of each AZ of the default VPC (sorted by AZ)."""
    if subnets:
        try:
            found = ec2.describe_subnets(SubnetIds=subnets)["Subnets"]
        except Exception as exc:
            if error_code(exc) in ("InvalidSubnetID.NotFound", "InvalidSubnetID.Malformed"):
                raise SpecError(
                    "subnets",
                    f"{error_message(exc)} in {region} (subnets must be in the job's region)",
                ) from None
            raise
        by_id = {s["SubnetId"]: s for s in found}
        missing = [s for s in subnets if s not in by_id]
        if missing:
            raise SpecError("subnets", f"{', '.join(missing)} not found in {region}")
        vpcs = sorted({str(s["VpcId"]) for s in found})
        if len(vpcs) > 1:
            raise SpecError(
                "subnets",
                f"must all be in one VPC (the job gets one security group); got {', '.join(vpcs)}",
            )
        zones = {s: str(by_id[s]["AvailabilityZone"]) for s in subnets}
        return Network(vpcs[0], list(subnets), zones)
    vpcs = ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])["Vpcs"]
    if not vpcs:
        raise SpecError(
            "subnets", f"{region} has no default VPC: give subnets (one per AZ, in fallback order)"
        )
    vpc_id = str(vpcs[0]["VpcId"])
    found = ec2.describe_subnets(
        Filters=[
            {"Name": "vpc-id", "Values": [vpc_id]},
            {"Name": "default-for-az", "Values": ["true"]},
        ]
    )["Subnets"]
    found.sort(key=lambda s: (str(s["AvailabilityZone"]), str(s["SubnetId"])))
    if not found:
        raise SpecError(
            "subnets", f"the default VPC {vpc_id} in {region} has no default subnets: give subnets"
        )
    zones = {str(s["SubnetId"]): str(s["AvailabilityZone"]) for s in found}
    return Network(vpc_id, list(zones), zones)


def caller_name(sts: Any) -> str:
    """Who launches, for the trainctl:owner tag: the name in the caller identity's ARN
    (user name, or role/session), else the local user name."""
    try:
        arn = str(sts.get_caller_identity()["Arn"])
    except Exception:  # preflight reports bad credentials; the tag only needs a name
        return local_user()
    resource = arn.split(":", 5)[-1]  # user/name, assumed-role/Role/session, root
    _, _, name = resource.partition("/")
    return name or resource


def local_user() -> str:
    try:
        return getpass.getuser()
    except Exception:
        return "unknown"

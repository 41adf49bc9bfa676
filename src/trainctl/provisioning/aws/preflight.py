"""Checks before anything is created or uploaded: read-only calls, one-line SpecErrors.

Order: region, credentials, instance types, instance profile, network, image, SSH CIDR,
so the first thing a user must fix is named first.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from trainctl.errors import SpecError
from trainctl.provisioning.aws import requests as rq
from trainctl.provisioning.aws.clients import Clients, error_code, error_message, resolve_region
from trainctl.provisioning.aws.lookups import resolve_image, resolve_network, scrub
from trainctl.spec.request import CapacityRequest

CREDENTIAL_ERRORS = frozenset(
    {
        "InvalidClientTokenId",
        "ExpiredToken",
        "ExpiredTokenException",
        "SignatureDoesNotMatch",
        "UnrecognizedClientException",
        "InvalidAccessKeyId",
        "AuthFailure",
        "RequestExpired",
        "AccessDenied",
        "InvalidToken",
    }
)
PARTITIONS = ("aws", "aws-cn", "aws-us-gov")


def known_regions() -> set[str]:
    from trainctl.store.boto import new_session

    session = new_session()
    regions: set[str] = set()
    for partition in PARTITIONS:
        regions.update(session.get_available_regions("ec2", partition_name=partition))
    return regions


def check_region(region: str) -> None:
    known = known_regions()
    if known and region not in known:
        examples = ", ".join(r for r in ("us-east-1", "us-west-2", "eu-west-1") if r in known)
        raise SpecError("region", f"{region!r} is not an AWS region (e.g. {examples})")


def check_credentials(sts: Any, region: str) -> None:
    from botocore.exceptions import BotoCoreError, NoCredentialsError, PartialCredentialsError

    try:
        sts.get_caller_identity()
    except (NoCredentialsError, PartialCredentialsError):
        raise SpecError(
            "credentials",
            "no AWS credentials found: set AWS_PROFILE, or AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, or log in with `aws sso login`",
        ) from None
    except BotoCoreError as exc:
        raise SpecError("region", f"cannot reach AWS STS in {region}: {scrub(str(exc))}") from None
    except Exception as exc:
        code = error_code(exc)
        if code in CREDENTIAL_ERRORS:
            raise SpecError(
                "credentials",
                f"AWS rejected the credentials ({code}): {scrub(error_message(exc))}",
            ) from None
        raise


def check_instance_types(ec2: Any, request: CapacityRequest, region: str) -> None:
    offered: set[str] = set()
    paginator = ec2.get_paginator("describe_instance_type_offerings")
    for page in paginator.paginate(
        LocationType="region",
        Filters=[{"Name": "instance-type", "Values": request.instance_types}],
    ):
        offered.update(o["InstanceType"] for o in page.get("InstanceTypeOfferings", []))
    for index, name in enumerate(request.instance_types):
        if name not in offered:
            field = "instance_type" if index == 0 else "fallback_instance_types"
            others = [t for t in request.instance_types if t in offered]
            hint = f"; offered of those asked: {', '.join(others)}" if others else ""
            raise SpecError(field, f"{name} is not offered in {region}{hint}")


# EC2's running-instance quotas are in vCPUs per family class and market (Service Quotas,
# service code "ec2"); the classes GPU training uses. Another class is not checked here (EC2
# says at launch).
VCPU_QUOTAS: dict[tuple[str, bool], tuple[str, str]] = {
    # (class, spot) -> (quota code, its name)
    ("standard", False): ("L-1216C47A", "Running On-Demand Standard instances"),
    ("standard", True): ("L-34B43A08", "All Standard Spot Instance Requests"),
    ("g", False): ("L-DB2E81BA", "Running On-Demand G and VT instances"),
    ("g", True): ("L-3819A6DF", "All G and VT Spot Instance Requests"),
    ("p", False): ("L-417A185B", "Running On-Demand P instances"),
    ("p", True): ("L-7212CCBC", "All P Spot Instance Requests"),
}
STANDARD_FAMILIES = frozenset("acdhimrtz")


def quota_class(instance_type: str) -> str | None:
    """The vCPU quota class of an instance type (p3.2xlarge: p; c5.xlarge: standard)."""
    family = instance_type.split(".")[0].lower()
    if family.startswith("p"):
        return "p"
    if family.startswith(("g", "vt")):
        return "g"
    if family[:1] in STANDARD_FAMILIES and not family.startswith(("dl", "inf", "trn", "hpc")):
        return "standard"
    return None


def check_vcpu_quota(quotas: Any, request: CapacityRequest, region: str) -> None:
    """The job's first type at full size within the account's vCPU quota for its market
    (a spot job's spot quota): a job larger than the account may run is one line naming
    instance_count before anything is launched. What cannot be checked (a type of another
    class, no such quota in the partition, no servicequotas:GetServiceQuota permission) is
    left to EC2, whose VcpuLimitExceeded at launch says the same."""
    from trainctl.spec.catalog import CATALOG

    kind = request.instance_type
    family_class = quota_class(kind)
    vcpus = CATALOG[kind].vcpus if kind in CATALOG else 0
    if family_class is None or not vcpus:
        return
    code, name = VCPU_QUOTAS[(family_class, request.use_spot_instances)]
    try:
        answer = quotas.get_service_quota(ServiceCode="ec2", QuotaCode=code)
        limit = float(answer["Quota"]["Value"])
    except Exception:  # a check, not a gate (see above)
        return
    needed = request.instance_count * vcpus
    if needed > limit:
        raise SpecError(
            "instance_count",
            f"{request.instance_count} x {kind} is {needed:,} vCPUs; the account's quota "
            f"for {name} in {region} is {limit:,.0f} vCPUs (Service Quotas {code}): ask "
            "for an increase, or fewer nodes",
        )


def remember_instance_types(ec2: Any, request: CapacityRequest, region: str) -> None:
    """EC2's own figures for the job's types, kept in the catalog's cache (GPUs per node,
    EFA interfaces): what the region says wins over the shipped snapshot."""
    from trainctl.spec.catalog import CATALOG
    from trainctl.spec.ec2types import refresh_cache

    try:
        refreshed = refresh_cache(ec2, region, request.instance_types)
    except Exception:  # a cache: the snapshot still knows the type (offerings were checked)
        return
    if refreshed:
        CATALOG.reload()


def refresh_instance_types(
    region: str | None = None, clients: Clients | None = None
) -> tuple[int, str]:
    """Ask EC2's DescribeInstanceTypes for every type of `region` (default: AWS's
    configured one) and keep the answer as the catalog's (`trainctl types --refresh`); how
    many types, and where it asked."""
    from trainctl.spec.catalog import CATALOG
    from trainctl.spec.ec2types import refresh_cache

    where = resolve_region(region)
    clients = clients or Clients()
    check_credentials(clients("sts", where), where)
    count = refresh_cache(clients("ec2", where), where)
    CATALOG.reload()
    return count, where


def require_instance_profile(instance_profile: str | None) -> str:
    if not instance_profile:
        raise SpecError(
            "instance_profile",
            "required for EC2: nodes reach the store with the instance profile's role (your "
            "credentials never go to a node); give the name or ARN of an instance profile",
        )
    return instance_profile


def check_instance_profile(iam: Any, request: CapacityRequest) -> None:
    name = rq.instance_profile_name(require_instance_profile(request.aws.instance_profile))
    try:
        profile = iam.get_instance_profile(InstanceProfileName=name)["InstanceProfile"]
    except Exception as exc:
        code = error_code(exc)
        if code == "NoSuchEntity":
            raise SpecError(
                "instance_profile", f"instance profile {name!r} not found in this account"
            ) from None
        if code in ("AccessDenied", "AccessDeniedException"):
            return  # the caller may launch with a profile it cannot read: RunInstances decides
        raise
    if not profile.get("Roles"):
        raise SpecError(
            "instance_profile",
            f"instance profile {name!r} has no role: nodes would get no credentials",
        )


def check_security_groups(ec2: Any, request: CapacityRequest, vpc_id: str, region: str) -> None:
    if not request.aws.security_group_ids:
        return
    try:
        groups = ec2.describe_security_groups(GroupIds=request.aws.security_group_ids)[
            "SecurityGroups"
        ]
    except Exception as exc:
        if error_code(exc) in ("InvalidGroup.NotFound", "InvalidGroupId.Malformed"):
            raise SpecError("security_group_ids", f"{error_message(exc)} in {region}") from None
        raise
    elsewhere = [g["GroupId"] for g in groups if g.get("VpcId") != vpc_id]
    if elsewhere:
        raise SpecError(
            "security_group_ids",
            f"{', '.join(elsewhere)} not in the job's VPC {vpc_id} (the subnets' VPC)",
        )


def check_ssh_cidr(cidr: str | None) -> None:
    if cidr is None:
        return
    try:
        ipaddress.ip_network(cidr, strict=True)
    except ValueError as exc:
        raise SpecError(
            "aws_ssh_cidr", f"{cidr!r} is not a network like 203.0.113.7/32 ({exc})"
        ) from None


def preflight(
    clients: Clients,
    request: CapacityRequest,
    region: str,
    default_image: str,
    ssh_cidr: str | None,
) -> None:
    # What needs no call first: a missing field is named before any network round trip.
    check_region(region)
    require_instance_profile(request.aws.instance_profile)
    check_ssh_cidr(ssh_cidr)
    check_credentials(clients("sts", region), region)
    ec2 = clients("ec2", region)
    check_instance_types(ec2, request, region)
    remember_instance_types(ec2, request, region)
    check_vcpu_quota(clients("service-quotas", region), request, region)
    check_instance_profile(clients("iam", region), request)
    network = resolve_network(ec2, request.aws.subnets, region)
    check_security_groups(ec2, request, network.vpc_id, region)
    image = resolve_image(
        ec2, clients("ssm", region), request.aws.image_id or default_image, region
    )
    if image.architecture != "x86_64":
        raise SpecError(
            "image_id",
            f"image {image.image_id} is {image.architecture}; {request.instance_type} needs x86_64",
        )

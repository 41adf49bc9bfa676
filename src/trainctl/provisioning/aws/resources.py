"""The job's EC2 resources, found by tag: made idempotently, listed, deleted.

Every resource trainctl creates carries `trainctl:job` (and `trainctl:attempt`,
`trainctl:owner`), so a fresh process, `trainctl gc` or a second provision call finds the
same things again without any local state.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from trainctl.errors import TrainctlError
from trainctl.provisioning.aws import requests as rq
from trainctl.provisioning.aws.clients import (
    AwsError,
    Timing,
    chunks,
    error_code,
    error_message,
    tags_of,
)
from trainctl.provisioning.aws.lookups import scrub

LIVE_STATES = ["pending", "running", "stopping", "stopped", "shutting-down"]
GONE_STATES = frozenset({"shutting-down", "terminated", "stopping", "stopped"})
_TERMINATE_BATCH = 500
_DESCRIBE_BATCH = 200


def job_filters(job: str, attempt: int | None = None) -> list[dict[str, Any]]:
    filters = [{"Name": f"tag:{rq.TAG_JOB}", "Values": [job]}]
    if attempt is not None:
        filters.append({"Name": f"tag:{rq.TAG_ATTEMPT}", "Values": [str(attempt)]})
    return filters


def describe_instances(
    ec2: Any, *, filters: list[dict[str, Any]] | None = None, ids: list[str] | None = None
) -> list[dict[str, Any]]:
    """Every instance matching `filters` or `ids` (paginated; ids in batches)."""
    paginator = ec2.get_paginator("describe_instances")
    batches: list[dict[str, Any]] = (
        [{"InstanceIds": batch} for batch in chunks(ids, _DESCRIBE_BATCH)]
        if ids
        else [{"Filters": filters or []}]
    )
    out = []
    for kwargs in batches:
        for page in paginator.paginate(**kwargs):
            for reservation in page.get("Reservations", []):
                out.extend(reservation.get("Instances", []))
    return out


def job_instances(
    ec2: Any, job: str, attempt: int | None = None, states: list[str] | None = None
) -> list[dict[str, Any]]:
    filters = job_filters(job, attempt)
    if states:
        filters.append({"Name": "instance-state-name", "Values": states})
    return describe_instances(ec2, filters=filters)


def state_of(instance: dict[str, Any]) -> str:
    return str(instance.get("State", {}).get("Name", ""))


# -- creating (idempotent) ------------------------------------------------------------------


def ensure_security_group(ec2: Any, ctx: rq.LaunchContext) -> str:
    """The id of the job's group in ctx.vpc_id (created if missing), with its ingress rules."""
    name = rq.resource_name(ctx.job)
    existing = ec2.describe_security_groups(
        Filters=[
            {"Name": "vpc-id", "Values": [ctx.vpc_id]},
            {"Name": "group-name", "Values": [name]},
        ]
    )["SecurityGroups"]
    if existing:
        group = existing[0]
        if tags_of(group).get(rq.TAG_JOB) != ctx.job:
            raise AwsError(
                f"security group {name} ({group['GroupId']}) in {ctx.vpc_id} is not tagged "
                f"{rq.TAG_JOB}={ctx.job}; trainctl will not use or delete it"
            )
        group_id = str(group["GroupId"])
    else:
        group_id = str(ec2.create_security_group(**rq.create_security_group(ctx))["GroupId"])
    params = rq.authorize_ingress(ctx, group_id)
    try:
        ec2.authorize_security_group_ingress(**params)
    except Exception as exc:
        # A group reused from an earlier call already has the rules (the SSH CIDR may be new:
        # then only the self rule is a duplicate and AWS adds nothing, so add SSH alone).
        if error_code(exc) != "InvalidPermission.Duplicate":
            raise
        ssh_only = dict(params, IpPermissions=params["IpPermissions"][1:])
        try:
            ec2.authorize_security_group_ingress(**ssh_only)
        except Exception as inner:
            if error_code(inner) != "InvalidPermission.Duplicate":
                raise
    return group_id


def ensure_placement_group(ec2: Any, ctx: rq.LaunchContext) -> bool:
    """The job's cluster placement group; True if it was created now."""
    name = rq.resource_name(ctx.job)
    try:
        groups = ec2.describe_placement_groups(GroupNames=[name])["PlacementGroups"]
    except Exception as exc:
        if error_code(exc) != "InvalidPlacementGroup.Unknown":
            raise
        groups = []
    groups = [g for g in groups if g.get("State") not in ("deleting", "deleted")]
    if groups:
        if tags_of(groups[0]).get(rq.TAG_JOB) != ctx.job:
            raise AwsError(
                f"placement group {name} exists and is not tagged {rq.TAG_JOB}={ctx.job}; "
                "trainctl will not use or delete it"
            )
        return False
    ec2.create_placement_group(**rq.create_placement_group(ctx))
    return True


def ensure_key_pair(ec2: Any, ctx: rq.LaunchContext) -> bool:
    """The job's key pair (trainctl's public key); True if it was imported now."""
    name = rq.resource_name(ctx.job)
    try:
        pairs = ec2.describe_key_pairs(KeyNames=[name])["KeyPairs"]
    except Exception as exc:
        if error_code(exc) != "InvalidKeyPair.NotFound":
            raise
        pairs = []
    if pairs:
        if tags_of(pairs[0]).get(rq.TAG_JOB) != ctx.job:
            raise AwsError(
                f"key pair {name} exists and is not tagged {rq.TAG_JOB}={ctx.job}; "
                "trainctl will not use or delete it"
            )
        return False
    params = rq.import_key_pair(ctx)
    params["PublicKeyMaterial"] = ctx.public_key.encode()
    ec2.import_key_pair(**params)
    return True


# -- deleting -------------------------------------------------------------------------------


def terminate_instances(ec2: Any, ids: list[str]) -> None:
    for batch in chunks(ids, _TERMINATE_BATCH):
        try:
            ec2.terminate_instances(InstanceIds=batch)
        except Exception as exc:
            if error_code(exc) != "InvalidInstanceID.NotFound":
                raise
            for instance_id in batch:  # one of them is gone already: end the others
                try:
                    ec2.terminate_instances(InstanceIds=[instance_id])
                except Exception as inner:
                    if error_code(inner) != "InvalidInstanceID.NotFound":
                        raise


def wait_terminated(ec2: Any, ids: list[str], timing: Timing, timeout: float) -> None:
    """Until every instance is terminated (or gone). Not botocore's `instance_terminated`
    waiter: it fails at once on an instance still `pending` (one whose launch raced the
    teardown) and on InvalidInstanceID.NotFound (an instance already gone), both of which
    are "keep waiting" or "done" for a teardown that must not stop half way."""
    if not ids:
        return

    def all_gone() -> bool | None:
        try:
            instances = describe_instances(ec2, ids=ids)
        except Exception as exc:
            if error_code(exc) == "InvalidInstanceID.NotFound":
                return True
            raise
        return True if all(state_of(i) == "terminated" for i in instances) else None

    timing.poll_until(all_gone, timeout=timeout, what=f"{len(ids)} instance(s) to terminate")


def _retry_delete(
    delete: Callable[[], Any], busy_codes: set[str], timing: Timing, deadline: float
) -> None:
    """Delete, retrying while AWS says the resource is still in use (until `deadline`)."""
    while True:
        try:
            delete()
            return
        except Exception as exc:
            code = error_code(exc)
            if code.endswith(".NotFound") or code.endswith(".Unknown"):
                return
            if code not in busy_codes or timing.clock() + timing.poll_seconds > deadline:
                raise
        timing.sleep(timing.poll_seconds)


def delete_security_group(ec2: Any, group_id: str, timing: Timing, deadline: float) -> None:
    _retry_delete(
        lambda: ec2.delete_security_group(GroupId=group_id),
        {"DependencyViolation", "InvalidGroup.InUse"},
        timing,
        deadline,
    )


def delete_placement_group(ec2: Any, name: str, timing: Timing, deadline: float) -> None:
    _retry_delete(
        lambda: ec2.delete_placement_group(GroupName=name),
        {"InvalidPlacementGroup.InUse"},
        timing,
        deadline,
    )


def delete_key_pair(ec2: Any, name: str) -> None:
    ec2.delete_key_pair(KeyName=name)


def job_security_groups(ec2: Any, job: str) -> list[dict[str, Any]]:
    return ec2.describe_security_groups(Filters=job_filters(job))["SecurityGroups"]


def job_placement_groups(ec2: Any, job: str) -> list[dict[str, Any]]:
    groups = ec2.describe_placement_groups(Filters=job_filters(job))["PlacementGroups"]
    return [g for g in groups if g.get("State") not in ("deleting", "deleted")]


def job_key_pairs(ec2: Any, job: str) -> list[dict[str, Any]]:
    return ec2.describe_key_pairs(Filters=job_filters(job))["KeyPairs"]


def terminate_job(
    ec2: Any, job: str, timing: Timing, timeout: float, *, placement_groups: bool = True
) -> None:
    """Delete every instance (all attempts), then the job's groups and key pair.

    `placement_groups=False` (setting aws_cluster_placement_group off) skips them: none were
    made, and some endpoints (moto) have no placement-group API at all."""
    deadline = timing.clock() + timeout
    instances = job_instances(ec2, job, states=LIVE_STATES)
    ids = [str(i["InstanceId"]) for i in instances]
    if ids:
        terminate_instances(ec2, ids)
    # Groups cannot go while an instance (its network interfaces) still uses them.
    pending = [str(i["InstanceId"]) for i in job_instances(ec2, job, states=LIVE_STATES)]
    left = max(0.0, deadline - timing.clock())
    try:
        wait_terminated(ec2, sorted(set(ids) | set(pending)), timing, left)
    except AwsError as exc:
        raise CleanupError(
            f"job {job}: instances still shutting down ({exc}); their security group, "
            "placement group and key pair remain: run `trainctl gc` later"
        ) from None
    problems = []
    for group in job_security_groups(ec2, job):
        try:
            delete_security_group(ec2, str(group["GroupId"]), timing, deadline)
        except Exception as exc:
            problems.append(f"security group {group['GroupId']}: {error_message(exc)}")
    for group in job_placement_groups(ec2, job) if placement_groups else []:
        try:
            delete_placement_group(ec2, str(group["GroupName"]), timing, deadline)
        except Exception as exc:
            problems.append(f"placement group {group['GroupName']}: {error_message(exc)}")
    for pair in job_key_pairs(ec2, job):
        try:
            delete_key_pair(ec2, str(pair["KeyName"]))
        except Exception as exc:
            problems.append(f"key pair {pair.get('KeyName')}: {error_message(exc)}")
    if problems:
        raise CleanupError(scrub(f"job {job}: could not delete " + "; ".join(problems)))


class CleanupError(TrainctlError):
    """Some of a job's EC2 resources could not be deleted (yet)."""


# -- leftovers (trainctl gc) ----------------------------------------------------------------

_KINDS = (
    "instance",
    "network-interface",
    "volume",
    "security-group",
    "placement-group",
    "key-pair",
)


def find_leftovers(
    ec2: Any, region: str, is_live: Callable[[str], bool], *, placement_groups: bool = True
) -> list[dict[str, Any]]:
    """Everything tagged `trainctl:job` whose job `is_live` says is over, in deletion order
    (placement groups only with `placement_groups`, see terminate_job)."""
    tagged = [{"Name": "tag-key", "Values": [rq.TAG_JOB]}]
    found: list[dict[str, Any]] = []

    def add(kind: str, resource_id: str, tags: dict[str, str], **extra: Any) -> None:
        found.append(
            {
                "kind": kind,
                "id": resource_id,
                "job": tags.get(rq.TAG_JOB, ""),
                "attempt": tags.get(rq.TAG_ATTEMPT),
                "owner": tags.get(rq.TAG_OWNER),
                "region": region,
                **extra,
            }
        )

    states = {"Name": "instance-state-name", "Values": LIVE_STATES}
    for inst in describe_instances(ec2, filters=[*tagged, states]):
        add("instance", inst["InstanceId"], tags_of(inst), state=state_of(inst))
    available = {"Name": "status", "Values": ["available"]}
    for eni in ec2.describe_network_interfaces(Filters=[*tagged, available])["NetworkInterfaces"]:
        add("network-interface", eni["NetworkInterfaceId"], tags_of(eni))
    for volume in ec2.describe_volumes(Filters=[*tagged, available])["Volumes"]:
        add("volume", volume["VolumeId"], tags_of(volume))
    for group in ec2.describe_security_groups(Filters=tagged)["SecurityGroups"]:
        add("security-group", group["GroupId"], tags_of(group), name=group.get("GroupName"))
    groups = (
        ec2.describe_placement_groups(Filters=tagged)["PlacementGroups"] if placement_groups else []
    )
    for group in groups:
        if group.get("State") not in ("deleting", "deleted"):
            add("placement-group", group["GroupName"], tags_of(group))
    for pair in ec2.describe_key_pairs(Filters=tagged)["KeyPairs"]:
        add("key-pair", pair["KeyName"], tags_of(pair), key_pair_id=pair.get("KeyPairId"))

    verdicts: dict[str, bool] = {}
    over = []
    for item in found:
        job = item["job"]
        if job not in verdicts:
            verdicts[job] = bool(job) and is_live(job)
        if not verdicts[job]:
            over.append(item)
    return sorted(over, key=lambda item: _KINDS.index(item["kind"]))


def delete_leftovers(
    ec2: Any, leftovers: list[dict[str, Any]], timing: Timing, timeout: float
) -> list[dict[str, Any]]:
    """Delete what `find_leftovers` returned; the ones that could not go, each with "error"."""
    deadline = timing.clock() + timeout
    failed: list[dict[str, Any]] = []
    by_kind: dict[str, list[dict[str, Any]]] = {kind: [] for kind in _KINDS}
    for item in leftovers:
        by_kind[item["kind"]].append(item)
    instance_ids = [item["id"] for item in by_kind["instance"]]
    if instance_ids:
        try:
            terminate_instances(ec2, instance_ids)
            wait_terminated(ec2, instance_ids, timing, max(0.0, deadline - timing.clock()))
        except Exception as exc:
            failed.extend({**item, "error": error_message(exc)} for item in by_kind["instance"])
    deleters: dict[str, Callable[[dict[str, Any]], Any]] = {
        "network-interface": lambda it: ec2.delete_network_interface(NetworkInterfaceId=it["id"]),
        "volume": lambda it: ec2.delete_volume(VolumeId=it["id"]),
        "security-group": lambda it: delete_security_group(ec2, it["id"], timing, deadline),
        "placement-group": lambda it: delete_placement_group(ec2, it["id"], timing, deadline),
        "key-pair": lambda it: delete_key_pair(ec2, it["id"]),
    }
    for kind, delete in deleters.items():
        for item in by_kind[kind]:
            try:
                delete(item)
            except Exception as exc:
                code = error_code(exc)
                if not (code.endswith(".NotFound") or code.endswith(".Unknown")):
                    failed.append({**item, "error": error_message(exc)})
    return failed


def node_address(instance: dict[str, Any], proxy_jump: str | None) -> str:
    """Where the controller reaches an instance: its public address, else (or through a
    jump host: EFA instances with several interfaces get no public one) its private one."""
    public = None if proxy_jump else instance.get("PublicIpAddress")
    return str(public or instance.get("PrivateIpAddress"))


def launch_time(value: Any) -> float:
    """An instance's LaunchTime in epoch seconds (now, where EC2 gave none)."""
    if isinstance(value, datetime):
        return value.timestamp()
    return time.time()


def ended_at(instance: dict[str, Any]) -> float | None:
    """When a terminated or stopped instance ended: EC2 writes it into the state transition
    reason ("User initiated (2026-01-02 03:04:05 GMT)"); the time of asking if it does not."""
    if state_of(instance) not in GONE_STATES:
        return None
    reason = str(instance.get("StateTransitionReason") or "")
    if "(" in reason and ")" in reason:
        stamp = reason[reason.rfind("(") + 1 : reason.rfind(")")]
        for suffix in (" GMT", " UTC"):
            stamp = stamp.removesuffix(suffix)
        try:
            parsed = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S")
            return parsed.replace(tzinfo=timezone.utc).timestamp()
        except ValueError:
            pass
    return time.time()

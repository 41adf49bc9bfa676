"""Warm capacity: a finished job's healthy instances, kept up for the next job that asks for
the same capacity (SageMaker's warm pools, `keep_alive_period_in_seconds`).

A warm pool has no state but its EC2 tags, like everything else trainctl makes:

- parking: the job's running instances, and the security group, placement group and key
  pair they use, are re-tagged `trainctl:job=warm.<job>` (job names have no '.', so a pool
  is never a job), with the capacity key, the expiry and the job that left them. Ending the
  job afterwards (terminate by tag) no longer finds them.
- claiming: a job whose capacity key matches, of the same owner, takes a whole healthy pool
  by re-tagging it as its own attempt; no RunInstances, and the hosts already have the agent,
  the image and the requirements' venvs from the last job.
- releasing: `terminate_job` of the pool name ends the instances and the groups. It happens
  on expiry (`trainctl gc`, any claim in the region, and on a real instance its own halt
  timer, see provider.py), with `trainctl warm --release`, or when a member is gone (a spot
  reclaim): a pool is all or nothing.

The capacity key covers what makes an instance fit a job: owner and trainctl's SSH key (the
instances let in this machine's key only; no one else's job can use them), region, type,
count, AMI, container image, market, instance profile (the nodes' permissions), subnets,
security groups and volume size.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from typing import Any

from trainctl.provisioning.aws import requests as rq
from trainctl.provisioning.aws.clients import Timing, error_code, tags_of
from trainctl.provisioning.aws.resources import (
    LIVE_STATES,
    describe_instances,
    job_filters,
    state_of,
    terminate_job,
)

TAG_WARM_KEY = "trainctl:warm-key"
TAG_WARM_UNTIL = "trainctl:warm-until"  # epoch seconds
TAG_WARM_SINCE = "trainctl:warm-since"  # epoch seconds: when the last job let go of it
TAG_WARM_FROM = "trainctl:warm-from"  # the job that left it
TAG_WARM_SIZE = "trainctl:warm-size"  # how many instances the pool has when whole
# When the instance's current job got it: a claimed warm instance was launched for another
# job, and this one is billed from here on.
TAG_SINCE = "trainctl:since"
POOL_PREFIX = "warm."
# A pool about to expire is not claimed: it could halt under the new job.
CLAIM_MARGIN_SECONDS = 60.0
_WARM_TAGS = (TAG_WARM_KEY, TAG_WARM_UNTIL, TAG_WARM_SINCE, TAG_WARM_FROM, TAG_WARM_SIZE)


def pool_name(job: str) -> str:
    return POOL_PREFIX + job


def is_pool(name: str) -> bool:
    return name.startswith(POOL_PREFIX)


def capacity_key(
    *,
    owner: str,
    ssh_key: str,
    region: str,
    instance_type: str,
    count: int,
    image_id: str,
    image_uri: str | None,
    market: str,
    instance_profile: str | None,
    subnets: list[str],
    security_group_ids: list[str],
    volume_size: int,
) -> str:
    """What an instance must match to be reused, as one short digest (a tag value)."""
    parts = {
        "owner": owner,
        "ssh_key": ssh_key.split()[1] if len(ssh_key.split()) > 1 else ssh_key,
        "region": region,
        "instance_type": instance_type,
        "count": count,
        "image_id": image_id,
        "image_uri": image_uri,
        "market": market,
        "instance_profile": instance_profile,
        "subnets": sorted(subnets),
        "security_group_ids": sorted(security_group_ids),
        "volume_size": volume_size,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]


def whole_in_rank_order(
    instances: list[dict[str, Any]], size: int = 0
) -> list[dict[str, Any]] | None:
    """`instances` in rank order if every rank 0..size-1 (size 0: as many as there are) is
    there and running; None otherwise."""
    ranked = {tags_of(i).get(rq.TAG_RANK): i for i in instances}
    wanted = [str(r) for r in range(size or len(instances))]
    if set(ranked) != set(wanted) or any(state_of(i) != "running" for i in instances):
        return None
    return [ranked[r] for r in wanted]


@dataclass
class WarmPool:
    """One pool, as its instances' tags describe it."""

    name: str
    region: str
    key: str
    from_job: str
    owner: str
    since: float
    until: float
    instances: list[dict[str, Any]] = field(default_factory=list)
    size: int = 0  # members when whole; 0: as many as there are

    @property
    def ids(self) -> list[str]:
        return [str(i["InstanceId"]) for i in self.instances]

    def by_rank(self) -> list[dict[str, Any]] | None:
        """The instances in rank order if every rank 0..size-1 is there and running."""
        return whole_in_rank_order(self.instances, self.size)

    def problem(self, now: float) -> str | None:
        """Why the pool cannot be claimed (None: it can)."""
        if self.until <= now:
            return "expired"
        if self.by_rank() is None:
            gone = [i["InstanceId"] for i in self.instances if state_of(i) != "running"]
            return f"instance(s) {', '.join(gone) or 'of some rank'} no longer running"
        return None

    def summary(self, now: float) -> dict[str, Any]:
        first = self.instances[0] if self.instances else {}
        return {
            "pool": self.name,
            "region": self.region,
            "from_job": self.from_job,
            "instance_type": first.get("InstanceType"),
            "count": self.size or len(self.instances),
            "market": "spot" if first.get("InstanceLifecycle") == "spot" else "on-demand",
            "instances": self.ids,
            "idle_seconds": round(max(0.0, now - self.since), 1),
            "expires_in_seconds": round(self.until - now, 1),
            "state": self.problem(now) or "warm",
        }


def find_pools(ec2: Any, region: str, keys: list[str] | None = None) -> list[WarmPool]:
    """The warm pools in `region` (those of `keys` only, if given), with every member not
    yet terminated; a member reclaimed meanwhile shows in its pool as not running."""
    key_filter = (
        {"Name": f"tag:{TAG_WARM_KEY}", "Values": keys}
        if keys
        else {"Name": "tag-key", "Values": [TAG_WARM_KEY]}
    )
    states = {"Name": "instance-state-name", "Values": LIVE_STATES}
    pools: dict[str, WarmPool] = {}
    for instance in describe_instances(ec2, filters=[key_filter, states]):
        tags = tags_of(instance)
        name = tags.get(rq.TAG_JOB, "")
        if not is_pool(name):
            continue  # claimed meanwhile (the warm tags go in the same call)
        pool = pools.get(name)
        if pool is None:
            pool = pools[name] = WarmPool(
                name=name,
                region=region,
                key=tags.get(TAG_WARM_KEY, ""),
                from_job=tags.get(TAG_WARM_FROM, ""),
                owner=tags.get(rq.TAG_OWNER, ""),
                since=_float(tags.get(TAG_WARM_SINCE)),
                until=_float(tags.get(TAG_WARM_UNTIL)),
                size=int(_float(tags.get(TAG_WARM_SIZE))),
            )
        pool.instances.append(instance)
    return sorted(pools.values(), key=lambda p: p.since)


def _float(value: str | None) -> float:
    try:
        return float(value or 0)
    except ValueError:
        return 0.0


def _job_resources(ec2: Any, job: str, *, placement_groups: bool) -> list[str]:
    """Ids of the job's security groups, key pairs and placement groups (for CreateTags;
    placement groups are tagged by their id)."""
    filters = job_filters(job)
    ids = [g["GroupId"] for g in ec2.describe_security_groups(Filters=filters)["SecurityGroups"]]
    ids += [k["KeyPairId"] for k in ec2.describe_key_pairs(Filters=filters)["KeyPairs"]]
    if placement_groups:
        groups = ec2.describe_placement_groups(Filters=filters)["PlacementGroups"]
        ids += [g["GroupId"] for g in groups if g.get("State") not in ("deleting", "deleted")]
    return [str(i) for i in ids if i]


def park(
    ec2: Any,
    job: str,
    instances: list[dict[str, Any]],
    *,
    key: str,
    seconds: float,
    placement_groups: bool,
    now: float | None = None,
) -> WarmPool:
    """Hand the job's `instances` (rank order) and its groups and key pair to a new pool."""
    now = time.time() if now is None else now
    name = pool_name(job)
    warm = [
        {"Key": rq.TAG_JOB, "Value": name},
        {"Key": TAG_WARM_KEY, "Value": key},
        {"Key": TAG_WARM_SINCE, "Value": f"{now:.0f}"},
        {"Key": TAG_WARM_UNTIL, "Value": str(int(now + seconds))},  # down: never late
        {"Key": TAG_WARM_FROM, "Value": job},
        {"Key": TAG_WARM_SIZE, "Value": str(len(instances))},
    ]
    resources = _job_resources(ec2, job, placement_groups=placement_groups)
    ids = [str(i["InstanceId"]) for i in instances]
    # The groups first: a crash in between leaves instances of the job (ended with it) and
    # never a pool whose groups the job's cleanup deletes from under it.
    if resources:
        ec2.create_tags(Resources=resources, Tags=[{"Key": rq.TAG_JOB, "Value": name}])
    for rank, instance_id in enumerate(ids):
        named = [*warm, {"Key": "Name", "Value": f"trainctl-{name}-{rank}"}]
        ec2.create_tags(Resources=[instance_id], Tags=named)
    return WarmPool(
        name=name,
        region="",
        key=key,
        from_job=job,
        owner=tags_of(instances[0]).get(rq.TAG_OWNER, "") if instances else "",
        since=now,
        until=now + seconds,
        instances=list(instances),
        size=len(instances),
    )


def claim_key_name(pool: str) -> str:
    """The key pair whose creation is a pool's claim: EC2 lets exactly one caller create a
    name, so of two jobs claiming one pool at once one gets it and the other launches."""
    return f"trainctl-claim-{pool}"


def claim(
    ec2: Any,
    pool: WarmPool,
    job: str,
    attempt: int,
    *,
    public_key: str,
    owner: str,
    placement_groups: bool,
    now: float | None = None,
) -> list[dict[str, Any]] | None:
    """Take `pool` for `job`'s `attempt`: its instances in rank order, re-tagged as the
    attempt's; None when another job claimed it first. The claim key pair is tagged as the
    job's own, so it goes with the job's other resources (gc's, if the job dies here)."""
    ranked = pool.by_rank()
    if ranked is None:
        return None
    now = time.time() if now is None else now
    tags = [
        {"Key": rq.TAG_JOB, "Value": job},
        {"Key": rq.TAG_ATTEMPT, "Value": str(attempt)},
        {"Key": rq.TAG_OWNER, "Value": owner},
    ]
    try:
        ec2.import_key_pair(
            KeyName=claim_key_name(pool.name),
            PublicKeyMaterial=public_key.encode(),
            TagSpecifications=[{"ResourceType": "key-pair", "Tags": tags}],
        )
    except Exception as exc:
        if error_code(exc) == "InvalidKeyPair.Duplicate":
            return None
        raise
    ids = [str(i["InstanceId"]) for i in ranked]
    resources = _job_resources(ec2, pool.name, placement_groups=placement_groups)
    since = {"Key": TAG_SINCE, "Value": f"{now:.0f}"}
    name = {"Key": "Name", "Value": f"trainctl-{job}-{attempt}"}
    ec2.create_tags(Resources=ids, Tags=[*tags, since, name])
    ec2.delete_tags(Resources=ids, Tags=[{"Key": k} for k in _WARM_TAGS])
    if resources:
        ec2.create_tags(Resources=resources, Tags=[{"Key": rq.TAG_JOB, "Value": job}])
    # The instances as EC2 now describes them, without another call.
    added = [*tags, since, name]
    dropped = {*_WARM_TAGS, *(t["Key"] for t in added)}
    return [
        {**i, "Tags": [*(t for t in i.get("Tags", []) if t["Key"] not in dropped), *added]}
        for i in ranked
    ]


def release(
    ec2: Any, pool: WarmPool, timing: Timing, timeout: float, *, placement_groups: bool
) -> None:
    """End the pool: its instances, then its groups and key pair."""
    terminate_job(ec2, pool.name, timing, timeout, placement_groups=placement_groups)

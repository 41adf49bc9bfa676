"""The EC2 provider's warm pools (SageMaker's keep_alive_period_in_seconds): instances kept up
after a job for the next one with the same capacity spec, claimed by a later job's attempt,
halted by a timer on the instance when nothing claims them, and billed as warm time to the
job that left them. A part of AwsProvider (provider.py), by what it does."""

from __future__ import annotations

import dataclasses
import shutil
import time
from pathlib import Path
from typing import Any

from trainctl.errors import TrainctlError
from trainctl.provisioning.aws import requests as rq
from trainctl.provisioning.aws import warm
from trainctl.provisioning.aws.capacity import BootFailed, wait_running
from trainctl.provisioning.aws.clients import (
    tags_of,
)
from trainctl.provisioning.aws.keys import default_key_path, ensure_key
from trainctl.provisioning.aws.lookups import caller_name
from trainctl.provisioning.aws.resources import (
    ended_at,
    job_instances,
    node_address,
    terminate_instances,
    terminate_job,
    wait_terminated,
)
from trainctl.provisioning.base import (
    InstanceUsage,
    WarmPools,
    WarmStart,
)
from trainctl.spec.capacity import SshHost
from trainctl.spec.request import CapacityRequest
from trainctl.spec.settings import get_settings


class AwsWarmPools(WarmPools):
    """AwsProvider's warm-pool capability; the provider holds the state these use."""

    def _warm_keys(
        self, request: CapacityRequest, region: str, owner: str, image_id: str, public_key: str
    ) -> list[str]:
        """The capacity keys `request` matches, in the order its launch choices try them."""
        pairs: list[tuple[str, str]] = []
        for choice in rq.launch_choices(request, ["-"]):
            if (choice.instance_type, choice.market) not in pairs:
                pairs.append((choice.instance_type, choice.market))
        return [
            _capacity_key(
                request, owner, public_key, region, t, request.instance_count, image_id, m
            )
            for t, m in pairs
        ]

    def _matching_pools(
        self, ec2: Any, request: CapacityRequest, ctx: rq.LaunchContext
    ) -> tuple[list[warm.WarmPool], list[warm.WarmPool]]:
        """(claimable, broken) warm pools for `request`, best first; broken ones have expired or
        lost a member (a spot reclaim) and are to be released."""
        keys = self._warm_keys(request, ctx.region, ctx.owner, ctx.image_id, ctx.public_key)
        pools = warm.find_pools(ec2, ctx.region, keys)
        pools = [p for p in pools if p.owner == ctx.owner]  # the key covers it; belt and braces
        now = time.time() + warm.CLAIM_MARGIN_SECONDS
        good = [p for p in pools if p.problem(now) is None]
        good.sort(key=lambda p: (keys.index(p.key), p.since))  # found by these very keys
        return good, [p for p in pools if p.problem(now) is not None]

    def _claim_warm(
        self, ec2: Any, request: CapacityRequest, job: str, attempt: int, ctx: rq.LaunchContext
    ) -> list[dict[str, Any]] | None:
        """A warm pool's instances for this attempt (rank order), or None if none matches."""
        settings = get_settings()
        good, broken = self._matching_pools(ec2, request, ctx)
        for pool in broken:
            self._release_pool(ec2, pool)
        for pool in good:
            instances = warm.claim(
                ec2,
                pool,
                job,
                attempt,
                public_key=ctx.public_key,
                owner=ctx.owner,
                placement_groups=settings.aws_cluster_placement_group,
            )
            if instances is None:
                continue  # another job claimed it first
            try:
                self._halt_timer(self.known_hosts(pool.name), instances, None)
            except TrainctlError:
                # A node that cannot be reached could halt under the job: not this pool.
                terminate_job(
                    ec2,
                    job,
                    self.timing,
                    settings.aws_cleanup_timeout_seconds,
                    placement_groups=settings.aws_cluster_placement_group,
                )
                continue
            pinned = self.known_hosts(pool.name)
            if pinned.exists():  # the host keys seen by the job that left them
                self.known_hosts(job).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(pinned, self.known_hosts(job))
                pinned.unlink(missing_ok=True)
            with self._lock:
                self._warm_starts[(job, attempt)] = WarmStart(
                    pool=pool.name,
                    from_job=pool.from_job,
                    instance_ids=pool.ids,
                    idle=self._idle_usage(ec2, pool, time.time()),
                )
            return instances
        return None

    def warm_start(self, job: str, attempt: int) -> WarmStart | None:
        with self._lock:
            return self._warm_starts.get((job, attempt))

    def keep_warm(self, job: str, seconds: float) -> list[str]:
        """Park the job's running instances (one whole attempt, every rank running) as a
        warm pool for `seconds`; their ids ([] when there is nothing healthy to keep)."""
        request = self._requests.get(job)
        if request is None or seconds <= 0:
            return []
        settings = get_settings()
        region = self.job_region(job)
        ec2 = self.client("ec2", region)
        running = job_instances(ec2, job, states=["running"])
        attempts = {tags_of(i).get(rq.TAG_ATTEMPT) for i in running}
        ranked = warm.whole_in_rank_order(running) if len(attempts) == 1 else None
        if not ranked:
            return []
        first = ranked[0]
        key = _capacity_key(
            request,
            caller_name(self.client("sts", region)),
            ensure_key(default_key_path()),
            region,
            str(first["InstanceType"]),
            len(ranked),
            str(first.get("ImageId", "")),
            rq.SPOT if first.get("InstanceLifecycle") == "spot" else rq.ON_DEMAND,
        )
        try:
            self._halt_timer(self.known_hosts(job), ranked, seconds)
        except TrainctlError:
            return []  # a warm instance without its own halt timer could outlive everything
        warm.park(
            ec2,
            job,
            ranked,
            key=key,
            seconds=seconds,
            placement_groups=settings.aws_cluster_placement_group,
        )
        with self._lock:
            for known in [k for k in self._nodes if k[0] == job]:
                del self._nodes[known]
        if self.known_hosts(job).exists():
            self.known_hosts(job).replace(self.known_hosts(warm.pool_name(job)))
        return [str(i["InstanceId"]) for i in ranked]

    def _halt_timer(
        self, known_hosts: Path, instances: list[dict[str, Any]], seconds: float | None
    ) -> None:
        """Each warm instance halts itself (so terminates) at the pool's expiry even if no
        trainctl process is left to end it: `shutdown -h +M`; `seconds=None` cancels it
        (a claim). Stand-in hosts (the test seam) are this machine: nothing is scheduled."""
        from trainctl.transport.ssh import SshConnector

        settings = get_settings()
        if settings.ssh_address_override:
            return
        if seconds is None:
            # `shutdown -c` exits non-zero on some systems when nothing is scheduled: what
            # counts is that systemd has no shutdown scheduled afterwards.
            command = "sudo shutdown -c 2>/dev/null; test ! -e /run/systemd/shutdown/scheduled"
        else:
            command = f"sudo shutdown -h +{max(1, int(seconds // 60))}"
        for instance in instances:
            host = SshHost(
                address=node_address(instance, settings.ssh_proxy_jump),
                user=settings.ssh_user,
                key_file=str(default_key_path()),
                python=settings.aws_node_python,
            )
            conn = SshConnector(host, known_hosts=known_hosts).connect(timeout=30)
            try:
                done = conn.run(command, timeout=30)
            finally:
                conn.close()
            if done.code != 0:
                raise TrainctlError(f"{conn.label}: {command} failed: {done.tail(1)}")

    def warm_pools(self, region: str, *, mine: bool = False) -> list[warm.WarmPool]:
        """The warm pools in `region`: every one (gc), or the caller's own (`trainctl warm`:
        a pool is only ever used or released by whoever left it)."""
        pools = warm.find_pools(self.client("ec2", region), region)
        if mine:
            owner = caller_name(self.client("sts", region))
            pools = [p for p in pools if p.owner == owner]
        return pools

    def release_warm(
        self, region: str, names: list[str] | None = None, *, unusable_only: bool = False
    ) -> list[tuple[warm.WarmPool, list[InstanceUsage]]]:
        """End the warm pools `names` (all if None; with `unusable_only` only the expired
        and broken ones): each with the idle time its instances were billed for."""
        ec2 = self.client("ec2", region)
        out = []
        now = time.time()
        for pool in self.warm_pools(region, mine=not unusable_only):
            if names is not None and pool.name not in names:
                continue
            if unusable_only and pool.problem(now) is None:
                continue
            idle = self._idle_usage(ec2, pool, now)
            self._release_pool(ec2, pool)
            out.append((pool, idle))
        return out

    def release_left_by(
        self, request: CapacityRequest, jobs: list[str]
    ) -> list[tuple[str, list[InstanceUsage]]]:
        names = [warm.pool_name(job) for job in jobs]
        released = self.release_warm(self.request_region(request), names)
        return [(pool.from_job, idle) for pool, idle in released]

    def _release_pool(self, ec2: Any, pool: warm.WarmPool) -> None:
        settings = get_settings()
        warm.release(
            ec2,
            pool,
            self.timing,
            settings.aws_cleanup_timeout_seconds,
            placement_groups=settings.aws_cluster_placement_group,
        )
        self.known_hosts(pool.name).unlink(missing_ok=True)

    def _idle_usage(self, ec2: Any, pool: warm.WarmPool, ended: float) -> list[InstanceUsage]:
        """The time the pool's instances waited, warm, for the job that left them: billed as
        that job's (its cost counts it)."""
        out = []
        for rank, instance in enumerate(pool.instances):
            usage = self._usage_of(ec2, instance, pool.region or self.job_region(pool.from_job), {})
            out.append(
                dataclasses.replace(
                    usage,
                    rank=rank,
                    started=pool.since,
                    ended=min(ended, ended_at(instance) or ended),
                    warm=True,
                )
            )
        return out

    def _reuse(
        self, ec2: Any, request: CapacityRequest, job: str, attempt: int, boot_timeout: float
    ) -> list[dict[str, Any]] | None:
        """The attempt's instances if an earlier provision call launched them all (by rank);
        None when there are none. A partial set (a node lost meanwhile, or a crash between
        launch and rank tags) cannot be all-or-nothing: it is ended, and launched anew."""
        found = job_instances(ec2, job, attempt, states=["pending", "running"])
        if not found:
            return None
        ranked = {tags_of(i).get(rq.TAG_RANK): i for i in found}
        if len(found) == request.instance_count and set(ranked) == {
            str(r) for r in range(request.instance_count)
        }:
            ids = [str(ranked[str(r)]["InstanceId"]) for r in range(request.instance_count)]
            try:
                return wait_running(ec2, ids, self.timing, boot_timeout)
            except BootFailed:  # one died meanwhile; wait_running ended the others
                wait_terminated(ec2, ids, self.timing, get_settings().aws_cleanup_timeout_seconds)
                return None
        ids = [str(i["InstanceId"]) for i in found]
        terminate_instances(ec2, ids)
        wait_terminated(ec2, ids, self.timing, get_settings().aws_cleanup_timeout_seconds)
        return None


def _capacity_key(
    request: CapacityRequest,
    owner: str,
    public_key: str,
    region: str,
    instance_type: str,
    count: int,
    image_id: str,
    market: str,
) -> str:
    """The warm-pool key of `request`'s capacity as it was (or would be) launched."""
    return warm.capacity_key(
        owner=owner,
        ssh_key=public_key,
        region=region,
        instance_type=instance_type,
        count=count,
        image_id=image_id,
        image_uri=request.image_uri,
        market=market,
        instance_profile=request.aws.instance_profile,
        subnets=list(request.aws.subnets),
        security_group_ids=list(request.aws.security_group_ids),
        volume_size=request.aws.root_volume_gb,
    )

"""The EC2 provider: a job's nodes are EC2 instances, launched all at once and found by tag.

provision: key pair, security group, placement group, then RunInstances with capacity
fallback (capacity.py), rank tags, wait for running. Nodes talk over their private addresses;
the controller reaches each over SSH (`ssh_target`) with trainctl's own key, and the agent
is started by the SSH transport. Everything is tagged `trainctl:job`, so terminate, gc and a
second provision find it again from any process.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import shutil
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from trainctl.cluster import (
    LOOPBACK_ENV,
    ClusterInfo,
    NodeInfo,
    is_loopback,
    node_name,
)
from trainctl.errors import SpecError, TrainctlError
from trainctl.image.container import IMAGE_PYTHON
from trainctl.provisioning.aws import requests as rq
from trainctl.provisioning.aws import resources, warm
from trainctl.provisioning.aws.capacity import Backoff, launch
from trainctl.provisioning.aws.clients import (
    AwsError,
    Clients,
    SessionFactory,
    Timing,
    resolve_region,
    tags_of,
)
from trainctl.provisioning.aws.keys import default_key_path, ensure_key
from trainctl.provisioning.aws.lookups import caller_name, resolve_image, resolve_network, scrub
from trainctl.provisioning.aws.preflight import check_ssh_cidr, require_instance_profile
from trainctl.provisioning.aws.pricing import on_demand_price, spot_price
from trainctl.provisioning.aws.resources import (
    GONE_STATES,
    ended_at,
    job_instances,
    launch_time,
    node_address,
    state_of,
    terminate_instances,
    terminate_job,
)
from trainctl.provisioning.aws.warm_pools import AwsWarmPools
from trainctl.provisioning.base import (
    DEFAULT_MASTER_PORT,
    Billing,
    FaultInjection,
    InstanceUsage,
    NodeRunner,
    Provider,
    SpotOutlook,
    WarmStart,
    make_cluster,
)
from trainctl.provisioning.ports import free_port
from trainctl.spec.capacity import SSM_PARAMETER_PREFIX, SshHost
from trainctl.spec.catalog import CATALOG
from trainctl.spec.checks import written_uris
from trainctl.spec.job import JobSpec
from trainctl.spec.request import CapacityRequest
from trainctl.spec.settings import get_settings

CHECKIP_URL = "https://checkip.amazonaws.com"
SPOT_RECLAIM_CODE = "Server.SpotInstanceTermination"
# EC2 nodes watch IMDSv2 for spot notices, and halt (so terminate) when orphaned. botocore
# asks IMDS for the instance profile's credentials once, with a 1 s timeout: a fresh or busy
# instance can miss that, and the agent then starts with no credentials for the store.
# botocore's own settings give it 5 tries of 5 s (`node_environment` may set others).
AGENT_ENV = {
    "TRAINCTL_IMDS": "1",
    "TRAINCTL_POWEROFF_WHEN_ORPHANED": "1",
    "AWS_METADATA_SERVICE_TIMEOUT": "5",
    "AWS_METADATA_SERVICE_NUM_ATTEMPTS": "5",
}


def public_address() -> str:
    """This machine's public IPv4 address as a /32, from AWS's checkip service."""
    import urllib.request

    try:
        with urllib.request.urlopen(CHECKIP_URL, timeout=10) as response:
            text = response.read(64).decode().strip()
        return f"{ipaddress.IPv4Address(text)}/32"
    except (OSError, ValueError) as exc:
        raise TrainctlError(
            f"cannot find this machine's public address from {CHECKIP_URL} ({exc}); set "
            "aws_ssh_cidr (TRAINCTL_AWS_SSH_CIDR) to the network allowed to SSH into nodes"
        ) from None


def parse_override(value: str) -> tuple[str, int]:
    """'host[:port]' (ssh_address_override) -> (host, port)."""
    host, sep, port = value.rpartition(":")
    if sep and port.isdigit() and host and not host.endswith(":"):
        return host.strip("[]"), int(port)
    return value, 22


class AwsProvider(AwsWarmPools, Provider, Billing, SpotOutlook, FaultInjection):
    name = "aws"

    def __init__(
        self,
        region: str | None = None,
        *,
        session_factory: SessionFactory | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        poll_seconds: float = 5.0,
        backoff: Backoff | None = None,
        public_address: Callable[[], str] = public_address,
    ) -> None:
        """`region`: where jobs go when their spec names none (else the AWS environment's).

        `session_factory(region)` makes the boto3 Session of a region (tests register event
        hooks on it); `sleep`/`clock`/`poll_seconds`/`backoff` set the pace of polling and
        capacity retries; `public_address()` gives the SSH CIDR when aws_ssh_cidr is unset.
        """
        self.region = region
        self.clients = Clients(session_factory)
        self.timing = Timing(sleep=sleep, clock=clock, poll_seconds=poll_seconds)
        self.backoff = backoff or Backoff()
        self._public_address = public_address
        self._lock = threading.Lock()
        self._job_regions: dict[str, str] = {}
        # (job, attempt) -> instances by rank, as last described; saves a call per SSH target
        self._nodes: dict[tuple[str, int], list[dict[str, Any]]] = {}
        # (job, attempt) -> each node's directory on its host; job -> its request (the image)
        self._host_roots: dict[tuple[str, int], list[str]] = {}
        self._requests: dict[str, CapacityRequest] = {}
        self._warm_starts: dict[tuple[str, int], WarmStart] = {}

    # -- where ----------------------------------------------------------------------------
    def request_region(self, request: CapacityRequest) -> str:
        return resolve_region(request.region, self.region)

    def job_region(self, job: str) -> str:
        """The region of a job's resources: where this process provisioned it, else the
        provider's or the environment's (a fresh process should pass the spec's region)."""
        with self._lock:
            known = self._job_regions.get(job)
        return known or resolve_region(None, self.region)

    def _remember(self, job: str, region: str) -> None:
        with self._lock:
            self._job_regions[job] = region

    def client(self, service: str, region: str) -> Any:
        return self.clients(service, region)

    # -- checks and plans -----------------------------------------------------------------
    def check_offline(self, spec: JobSpec, store_uri: str) -> None:
        """EC2 nodes reach the store with their instance profile: only S3 is reachable."""
        uris = {"TRAINCTL_STORE": store_uri, **dict(written_uris(spec))}
        uris.update({f"inputs.{name}": uri for name, uri in spec.inputs.items()})
        for field, uri in uris.items():
            if uri and not uri.startswith("s3://"):
                raise SpecError(
                    field,
                    f"{uri} is not reachable from EC2 nodes; use an s3:// URI"
                    + (" (TRAINCTL_STORE=s3://bucket/prefix)" if field == "TRAINCTL_STORE" else ""),
                )
        # before any call: no cloud is needed to tell
        require_instance_profile(spec.instance_profile)
        gpus = CATALOG[spec.instance_type].gpus
        if gpus and spec.processes_per_host is not None and spec.processes_per_host > gpus:
            raise SpecError(
                "processes_per_host",
                f"{spec.processes_per_host} workers per node but {spec.instance_type} has "
                f"{gpus} GPU(s): at most {gpus} (NCCL needs a GPU each)",
            )

    def preflight(self, request: CapacityRequest) -> None:
        from trainctl.provisioning.aws.preflight import preflight

        settings = get_settings()
        region = self.request_region(request)
        preflight(self.clients, request, region, settings.aws_default_image, settings.aws_ssh_cidr)

    def dry_run(self, request: CapacityRequest, job: str, attempt: int) -> list[dict[str, Any]]:
        """Every mutating request provision makes, in order, with placeholders for what only
        exists by then (ids, the resolved image, the caller's name). No call is made."""
        settings = get_settings()
        region = self.request_region(request)
        require_instance_profile(request.aws.instance_profile)
        check_ssh_cidr(settings.aws_ssh_cidr)
        image = request.aws.image_id or settings.aws_default_image
        image_id = (
            f"<AMI id in SSM parameter {image[len(SSM_PARAMETER_PREFIX) :]}>"
            if image.startswith(SSM_PARAMETER_PREFIX)
            else image
        )
        subnets = list(request.aws.subnets) or [rq.DEFAULT_SUBNET_PLACEHOLDER]
        vpc = (
            f"<VpcId of {request.aws.subnets[0]}>"
            if request.aws.subnets
            else "<VpcId of the default VPC>"
        )
        ctx = rq.LaunchContext(
            job=job,
            attempt=attempt,
            region=region,
            owner="<name in the caller identity ARN>",
            image_id=image_id,
            root_device_name=f"<RootDeviceName of {image_id}>",
            vpc_id=vpc,
            ssh_cidr=settings.aws_ssh_cidr or "<this machine's public IPv4 address>/32",
            public_key=f"<public key of {default_key_path()}>",
            ssh_user=settings.ssh_user,
        )
        out: list[dict[str, Any]] = []
        if request.aws.security_group_ids:
            ctx = dataclasses.replace(ctx, security_group_ids=tuple(request.aws.security_group_ids))
        else:
            group = rq.SECURITY_GROUP_PLACEHOLDER
            out.append(rq.request("CreateSecurityGroup", rq.create_security_group(ctx), region))
            out.append(
                rq.request(
                    "AuthorizeSecurityGroupIngress", rq.authorize_ingress(ctx, group), region
                )
            )
            ctx = dataclasses.replace(ctx, security_group_ids=(group,))
        if rq.uses_placement_group(request, settings.aws_cluster_placement_group):
            out.append(rq.request("CreatePlacementGroup", rq.create_placement_group(ctx), region))
            ctx = dataclasses.replace(ctx, placement_group=rq.resource_name(job))
        out.append(rq.request("ImportKeyPair", rq.import_key_pair(ctx), region))
        for index, choice in enumerate(rq.launch_choices(request, subnets)):
            when = "first" if index == 0 else "after a capacity error of the request before"
            out.append(
                rq.request(
                    "RunInstances", rq.run_instances(ctx, request, choice), region, when=when
                )
            )
        for rank in range(request.instance_count):
            params = rq.rank_tags(ctx, rq.instance_id_placeholder(rank), rank)
            out.append(rq.request("CreateTags", params, region))
        return out

    def planned_cluster(self, request: CapacityRequest, job: str, attempt: int) -> ClusterInfo:
        cluster = super().planned_cluster(request, job, attempt)
        return cluster.model_copy(update={"network_env": rq.network_env(request.instance_type)})

    # -- provisioning ---------------------------------------------------------------------
    def provision(self, request: CapacityRequest, job: str, attempt: int) -> ClusterInfo:
        settings = get_settings()
        region = self.request_region(request)
        require_instance_profile(request.aws.instance_profile)
        self._remember(job, region)
        ec2 = self.client("ec2", region)
        ctx = self._identity_context(request, region, job, attempt)
        instances = self._reuse(ec2, request, job, attempt, settings.aws_boot_timeout_seconds)
        if instances is None:
            instances = self._claim_warm(ec2, request, job, attempt, ctx)
        if instances is None:
            network = resolve_network(ec2, list(request.aws.subnets), region)
            ctx = dataclasses.replace(ctx, vpc_id=network.vpc_id)
            ctx = self._ensure_job_resources(ec2, request, ctx)
            earlier = len(job_instances(ec2, job, attempt))
            ctx = dataclasses.replace(ctx, launched_before=earlier)
            launched = launch(
                ec2,
                ctx,
                request,
                rq.launch_choices(request, network.subnets),
                timing=self.timing,
                retry_for=float(request.retry_for or settings.aws_capacity_wait_seconds),
                boot_timeout=settings.aws_boot_timeout_seconds,
                backoff=self.backoff,
            )
            instances = launched.instances
        with self._lock:
            self._nodes[(job, attempt)] = instances
        return self._cluster(request, job, attempt, instances)

    def _identity_context(
        self, request: CapacityRequest, region: str, job: str, attempt: int
    ) -> rq.LaunchContext:
        """The launch context of what a warm pool is matched on and a launch needs first:
        the resolved image, the caller's name and trainctl's public key (the network,
        groups and SSH CIDR are resolved for a launch only)."""
        settings = get_settings()
        image = resolve_image(
            self.client("ec2", region),
            self.client("ssm", region),
            request.aws.image_id or settings.aws_default_image,
            region,
        )
        return rq.LaunchContext(
            job=job,
            attempt=attempt,
            region=region,
            owner=caller_name(self.client("sts", region)),
            image_id=image.image_id,
            root_device_name=image.root_device_name,
            vpc_id="",
            ssh_cidr="",
            public_key=ensure_key(default_key_path()),
            ssh_user=settings.ssh_user,
        )

    def _ensure_job_resources(
        self, ec2: Any, request: CapacityRequest, ctx: rq.LaunchContext
    ) -> rq.LaunchContext:
        """The job's security group (unless the request names its own), placement group and
        key pair, made if missing; the launch context that uses them."""
        settings = get_settings()
        if request.aws.security_group_ids:
            ctx = dataclasses.replace(ctx, security_group_ids=tuple(request.aws.security_group_ids))
        else:
            check_ssh_cidr(settings.aws_ssh_cidr)
            cidr = settings.aws_ssh_cidr or self._public_address()
            ctx = dataclasses.replace(ctx, ssh_cidr=cidr)
            group_id = resources.ensure_security_group(ec2, ctx)
            ctx = dataclasses.replace(ctx, security_group_ids=(group_id,))
        if rq.uses_placement_group(request, settings.aws_cluster_placement_group):
            resources.ensure_placement_group(ec2, ctx)
            ctx = dataclasses.replace(ctx, placement_group=rq.resource_name(ctx.job))
        resources.ensure_key_pair(ec2, ctx)
        return ctx

    # -- warm capacity --------------------------------------------------------------------
    def capacity_plan(self, request: CapacityRequest) -> str | None:
        """Whether a submit now would start on a warm pool, by read-only calls (the pool
        could still be taken by another job first: then new instances are launched)."""
        if not default_key_path().exists():
            return "new instances (no warm pool can match: this machine has no trainctl key yet)"
        try:
            region = self.request_region(request)
            ctx = self._identity_context(request, region, "-", 1)
            good, _ = self._matching_pools(self.client("ec2", region), request, ctx)
        except Exception as exc:
            return f"new instances unless a warm pool matches (could not look: {scrub(str(exc))})"
        if not good:
            return "new instances (no warm pool matches this capacity request)"
        pool = good[0]
        left = pool.until - time.time()
        return (
            f"reuses warm pool {pool.name} ({len(pool.ids)} x "
            f"{pool.instances[0].get('InstanceType')}, left by job {pool.from_job}, "
            f"expires in {left:.0f} s): {', '.join(pool.ids)}; no RunInstances"
        )

    def _cluster(
        self, request: CapacityRequest, job: str, attempt: int, instances: list[dict[str, Any]]
    ) -> ClusterInfo:
        instance_type = str(instances[0]["InstanceType"])
        overrides = get_settings().ssh_address_override
        addresses = [str(i.get("PrivateIpAddress") or "") for i in instances]
        for rank, value in enumerate(overrides[: len(addresses)]):
            addresses[rank] = parse_override(value)[0]
        network_env = rq.network_env(instance_type)
        roots = ["/"] * len(addresses)  # an instance is the job's: the layout is /opt/ml
        master_port = DEFAULT_MASTER_PORT
        if overrides and all(is_loopback(a) for a in addresses):
            # Test seam: loopback sshd servers on this machine stand in for the instances;
            # each gets its own layout root here, as the local provider's nodes do, and a
            # free rendezvous port (jobs side by side on one machine share its addresses).
            network_env = dict(LOOPBACK_ENV)
            master_port = free_port(addresses[0])
            roots = [str(self._seam_root(job, attempt, rank)) for rank in range(len(addresses))]
            for root in roots:
                Path(root).mkdir(parents=True, exist_ok=True)
        with self._lock:
            self._host_roots[(job, attempt)] = list(roots)
            self._requests[job] = request
        if request.image_uri:
            roots = ["/"] * len(addresses)  # the agent sees the host's node dir at /opt/ml
        nodes = [
            NodeInfo(
                rank=rank,
                host=node_name(rank, address, in_container=bool(request.image_uri)),
                address=address,
                root=root,
            )
            for rank, (address, root) in enumerate(zip(addresses, roots, strict=True))
        ]
        spot = all(i.get("InstanceLifecycle") == "spot" for i in instances)
        return make_cluster(
            request,
            job,
            attempt,
            self.name,
            instance_type,
            nodes,
            master_port=master_port,
            network_env=network_env,
            market="spot" if spot else "on-demand",
        )

    @staticmethod
    def _seam_root(job: str, attempt: int, rank: int) -> Path:
        return get_settings().home / "nodes" / job / f"attempt-{attempt}" / f"node-{rank}"

    # -- nodes ----------------------------------------------------------------------------
    def _instances(self, job: str, attempt: int) -> dict[int, dict[str, Any]]:
        """The attempt's live instances by rank: remembered from provision, else by tag."""
        with self._lock:
            known = self._nodes.get((job, attempt))
        if known is not None:
            return dict(enumerate(known))
        ec2 = self.client("ec2", self.job_region(job))
        by_rank = {}
        for instance in job_instances(ec2, job, attempt):
            rank = tags_of(instance).get(rq.TAG_RANK)
            if rank is not None and rank.isdigit() and state_of(instance) not in GONE_STATES:
                by_rank[int(rank)] = instance
        return by_rank

    def ssh_target(self, cluster: ClusterInfo, rank: int) -> SshHost:
        """How the controller reaches the node of `rank` over SSH: its public address if it
        has one, else (or through the ssh_proxy_jump jump host) its private one; trainctl's
        key; the DLAMI's interpreter. `ssh_address_override` (a test seam) replaces the address."""
        settings = get_settings()
        overrides = settings.ssh_address_override
        port = 22
        if rank < len(overrides):
            address, port = parse_override(overrides[rank])
        else:
            instance = self._instances(cluster.job, cluster.attempt).get(rank)
            if instance is None:
                raise AwsError(
                    f"job {cluster.job} attempt {cluster.attempt}: no running instance of rank "
                    f"{rank}"
                )
            address = node_address(instance, settings.ssh_proxy_jump)
        return SshHost(
            address=address,
            port=port,
            user=settings.ssh_user,
            key_file=str(default_key_path()),
            # Stand-in hosts (the test seam) have no GPUs of their own.
            gpus=0
            if overrides or cluster.instance_type not in CATALOG
            else CATALOG[cluster.instance_type].gpus,
            python=settings.aws_node_python,
        )

    def node_runner(self, cluster: ClusterInfo, rank: int) -> NodeRunner:
        """The agent over SSH on the instance of `rank`, once its user data has finished
        (the agent or the image made sure of then)."""
        from trainctl.provisioning.remote import SshRunner

        settings = get_settings()
        itype = CATALOG.get(cluster.instance_type)
        with self._lock:
            request = self._requests.get(cluster.job)
            roots = self._host_roots.get((cluster.job, cluster.attempt))
        image_uri = request.image_uri if request is not None else None
        return SshRunner(
            target=partial(self.ssh_target, cluster, rank),
            cluster=cluster,
            rank=rank,
            # the image's interpreter in a container, else the DLAMI's
            python=IMAGE_PYTHON if image_uri else settings.aws_node_python,
            known_hosts=self.known_hosts(cluster.job),
            connect_timeout=settings.aws_boot_timeout_seconds,
            image_uri=image_uri,
            request=request,
            host_root=roots[rank] if roots and rank < len(roots) else cluster.node(rank).root,
            efa_devices=0 if settings.ssh_address_override or not itype else itype.efa_interfaces,
            # Stand-in hosts (the test seam) run no user data.
            wait_for_marker=not settings.ssh_address_override,
            retry_auth=True,
            agent_env=self._agent_env(),
        )

    @staticmethod
    def _agent_env() -> dict[str, str]:
        env = dict(AGENT_ENV)
        if get_settings().ssh_address_override:
            # Stand-in hosts are not instances of their own: halting one would halt the
            # machine the tests run on, and it has none of the instance type's GPUs.
            env.pop("TRAINCTL_POWEROFF_WHEN_ORPHANED")
            env["TRAINCTL_GPU_HEALTH_CHECK"] = "0"
        return env

    def known_hosts(self, job: str) -> Path:
        """Host keys pinned per job: EC2 reuses addresses, so a new instance at an old
        address has a new key legitimately; within a job, a changed key is refused."""
        return get_settings().home / "ssh" / "known_hosts.d" / job

    def kill_node(self, cluster: ClusterInfo, rank: int) -> None:
        """Terminate the node's instance at once, as a spot reclaim would."""
        instance = self._instances(cluster.job, cluster.attempt).get(rank)
        if instance is None:
            return  # already gone
        ec2 = self.client("ec2", self.job_region(cluster.job))
        terminate_instances(ec2, [str(instance["InstanceId"])])

    def lost_nodes(self, cluster: ClusterInfo) -> dict[int, str]:
        ec2 = self.client("ec2", self.job_region(cluster.job))
        by_rank: dict[int, dict[str, Any]] = {}
        for instance in job_instances(ec2, cluster.job, cluster.attempt):
            rank = tags_of(instance).get(rq.TAG_RANK)
            if rank is not None and rank.isdigit():
                by_rank[int(rank)] = instance
        lost = {}
        for node in cluster.nodes:
            instance = by_rank.get(node.rank)
            if instance is None:
                lost[node.rank] = "instance no longer listed by EC2"
                continue
            state = state_of(instance)
            if state not in GONE_STATES:
                continue
            reason = instance.get("StateReason") or {}
            if reason.get("Code") == SPOT_RECLAIM_CODE:
                lost[node.rank] = "spot reclaim"
            else:
                why = reason.get("Message") or reason.get("Code") or "no reason given"
                lost[node.rank] = f"instance {instance['InstanceId']} {state} ({why})"
        return lost

    # -- cleanup --------------------------------------------------------------------------
    def terminate(self, job: str, *, grace: float) -> None:
        """Every instance of the job (all attempts), then its security group, placement
        group and key pair. `grace` is not used: the controller has already stopped the
        agents, and an EC2 termination is final anyway."""
        region = self.job_region(job)
        settings = get_settings()
        terminate_job(
            self.client("ec2", region),
            job,
            self.timing,
            settings.aws_cleanup_timeout_seconds,
            placement_groups=settings.aws_cluster_placement_group,
        )
        with self._lock:
            for key in [k for k in self._nodes if k[0] == job]:
                del self._nodes[key]
        self.known_hosts(job).unlink(missing_ok=True)
        seam_dir = get_settings().home / "nodes" / job  # only the loopback test seam makes it
        if seam_dir.is_dir():
            shutil.rmtree(seam_dir, ignore_errors=True)
            try:
                seam_dir.parent.rmdir()  # only if no other job's nodes are there
            except OSError:
                pass

    def find_leftovers(self, region: str, is_live: Callable[[str], bool]) -> list[dict[str, Any]]:
        """For `trainctl gc`: everything tagged trainctl:job in `region` whose job is over."""
        from trainctl.provisioning.aws.resources import find_leftovers

        enabled = get_settings().aws_cluster_placement_group
        ec2 = self.client("ec2", region)
        # A warm pool's groups are in use while it has instances (gc releases the pools
        # themselves when they expire); without any they are leftovers as a job's would be.
        pools = {pool.name for pool in warm.find_pools(ec2, region)}

        def live(job: str) -> bool:
            return job in pools if warm.is_pool(job) else is_live(job)

        return find_leftovers(ec2, region, live, placement_groups=enabled)

    def delete_leftovers(
        self, region: str, leftovers: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """Delete what find_leftovers returned; returns those that could not go (with "error")."""
        from trainctl.provisioning.aws.resources import delete_leftovers

        timeout = get_settings().aws_cleanup_timeout_seconds
        return delete_leftovers(self.client("ec2", region), leftovers, self.timing, timeout)

    # -- cost -----------------------------------------------------------------------------
    def usage(self, job: str) -> list[InstanceUsage]:
        region = self.job_region(job)
        ec2 = self.client("ec2", region)
        spot_prices: dict[tuple[str, str | None], float | None] = {}
        out = [self._usage_of(ec2, i, region, spot_prices) for i in job_instances(ec2, job)]
        return sorted(out, key=lambda u: (u.attempt, u.rank, u.instance_id))

    def _usage_of(
        self,
        ec2: Any,
        instance: dict[str, Any],
        region: str,
        spot_prices: dict[tuple[str, str | None], float | None],
    ) -> InstanceUsage:
        tags = tags_of(instance)
        instance_type = str(instance["InstanceType"])
        zone = instance.get("Placement", {}).get("AvailabilityZone")
        market = "spot" if instance.get("InstanceLifecycle") == "spot" else "on-demand"
        if market == "spot":
            key = (instance_type, zone)
            if key not in spot_prices:
                spot_prices[key] = spot_price(ec2, instance_type, zone)
            price = spot_prices[key]
        else:
            price = on_demand_price(instance_type, region)
        started = launch_time(instance.get("LaunchTime"))
        if tags.get(warm.TAG_SINCE):  # a warm instance this job claimed: billed from then
            started = max(started, float(tags[warm.TAG_SINCE]))
        return InstanceUsage(
            attempt=int(tags.get(rq.TAG_ATTEMPT, "0") or 0),
            rank=int(tags.get(rq.TAG_RANK, "-1") or -1),
            instance_id=str(instance["InstanceId"]),
            instance_type=instance_type,
            market=market,
            zone=zone,
            started=started,
            ended=ended_at(instance),
            usd_per_hour=price,
        )

    def spot_outlook(self, request: CapacityRequest, job: str) -> bool | None:
        """EC2's placement scores and spot prices for the job's type, count and zones
        (trainctl.provisioning.aws.outlook); None where EC2 gives no answer."""
        from trainctl.provisioning.aws.outlook import spot_outlook

        region = self.request_region(request)
        ec2 = self.client("ec2", region)
        zones = None
        if request.aws.subnets:
            zones = list(resolve_network(ec2, list(request.aws.subnets), region).zones.values())
        return spot_outlook(
            ec2,
            request.instance_type,
            request.instance_count,
            region,
            zones=zones,
            on_demand_usd_per_hour=on_demand_price(request.instance_type, region),
        )

    def hourly_cost(self, request: CapacityRequest) -> float | None:
        """USD/hour of the first launch choice: the spot price (lowest latest price of the
        subnets' AZs, or of the region) or the us-east-1 list price; None when unknown."""
        region = self.request_region(request)
        if not request.use_spot_instances:
            price = on_demand_price(request.instance_type, region)
            return None if price is None else price * request.instance_count
        ec2 = self.client("ec2", region)
        if request.aws.subnets:
            zones = resolve_network(ec2, list(request.aws.subnets), region).zones
            prices = [spot_price(ec2, request.instance_type, zones[s]) for s in request.aws.subnets]
            known = [p for p in prices if p is not None]
            price = min(known) if known else None
        else:
            price = spot_price(ec2, request.instance_type)
        return None if price is None else price * request.instance_count

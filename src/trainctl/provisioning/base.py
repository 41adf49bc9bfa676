"""The provider interface: provision N hosts, run an agent on each, watch, terminate.

Providers own capacity only; what runs on a node is the agent's business (container/agent)
and what the agent runs is the launcher's (launcher/).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel

from trainctl.cluster import ClusterInfo, NodeInfo, host_name
from trainctl.errors import TrainctlError
from trainctl.spec.catalog import InstanceType
from trainctl.spec.job import JobSpec
from trainctl.spec.request import CapacityRequest
from trainctl.transport import RunningProcess

DEFAULT_MASTER_PORT = 29500  # torchrun's
# The version of what a provider plug-in relies on (trainctl.plugin, this contract): a plug-in
# says which it was written for, and one written for another is refused by name, not run.
PLUGIN_API = 1


class NoCapacityError(TrainctlError):
    """`provision` could not get the nodes asked for (none launched): an elastic job may
    ask for fewer."""


class StoppedOutsideError(TrainctlError):
    """The job's capacity was ended by its owner outside trainctl (Slurm's `scancel`): the
    job is stopped, as `trainctl stop` would, not relaunched."""


@dataclass(frozen=True)
class InstanceUsage:
    """One instance's billable time, for a job's cost (`trainctl status`)."""

    attempt: int
    rank: int
    instance_id: str
    instance_type: str
    market: str  # 'spot' | 'on-demand' | 'owned' (ssh hosts, local)
    zone: str | None
    started: float  # epoch seconds (launch time)
    ended: float | None  # epoch seconds; None while running
    usd_per_hour: float | None  # None when unknown (then no cost is claimed)
    # Idle time kept warm after the job for a next one (keep_alive_period_in_seconds).
    warm: bool = False


@dataclass(frozen=True)
class WarmStart:
    """An attempt that started on warm capacity: the pool it claimed, and the idle time the
    pool's instances spent waiting, which the job that left them is billed for."""

    pool: str
    from_job: str
    instance_ids: list[str]
    idle: list[InstanceUsage]


class Provider(ABC):
    """The core every provider has: check a spec, plan (the dry run's requests), provision
    an attempt's nodes, describe them (which are lost), terminate the job's resources; and
    start the node agent on a node it provisioned. What only some providers can do is a
    capability below (Billing, WarmPools, CapacityProbe, SpotOutlook, FaultInjection),
    which callers check with isinstance, never by a provider's class."""

    name: str

    def check_offline(self, spec: JobSpec, store_uri: str) -> None:
        """Check `spec` against what this provider's nodes can do, with no call at all (a
        dry run makes these checks and no others); SpecError if it cannot run here."""
        return None

    def preflight(self, request: CapacityRequest) -> None:
        """Check that `request` can be provisioned, with read-only calls; SpecError if not.

        Runs before anything is uploaded or created (credentials, region offers the type,
        instance profile, subnets, image...). Nothing to check by default.
        """
        return None

    def planned_cluster(self, request: CapacityRequest, job: str, attempt: int) -> ClusterInfo:
        """The cluster `provision` would return, for a dry run: what is known before launch.

        Addresses that exist only after launch are placeholders ("<algo-1 address>"); the
        master port is torchrun's default where the real one is chosen at launch.
        """
        nodes = [
            NodeInfo(rank=r, host=host_name(r), address=f"<{host_name(r)} address>", root="/")
            for r in range(request.instance_count)
        ]
        return make_cluster(request, job, attempt, self.name, request.instance_type, nodes)

    @abstractmethod
    def dry_run(self, request: CapacityRequest, job: str, attempt: int) -> list[dict[str, Any]]:
        """The requests `provision` would make ({"service", "operation", "params"}), unsent."""

    @abstractmethod
    def provision(self, request: CapacityRequest, job: str, attempt: int) -> ClusterInfo:
        """`request.instance_count` hosts for one attempt, all or nothing; NoCapacityError
        when there are none to be had (nothing launched); StoppedOutsideError when the
        user ended the job's capacity outside trainctl."""

    def lost_nodes(self, cluster: ClusterInfo) -> dict[int, str]:
        """Ranks of `cluster` whose machine is gone, with why (e.g. a spot reclaim);
        StoppedOutsideError when the user ended the capacity outside trainctl."""
        return {}

    @abstractmethod
    def terminate(self, job: str, *, grace: float) -> None:
        """Release everything the job holds on this provider. Idempotent; finds by tag."""

    # -- running the agent on a node ------------------------------------------------------
    @abstractmethod
    def node_runner(self, cluster: ClusterInfo, rank: int) -> NodeRunner:
        """How the agent of `rank` runs on its node: a process here, over SSH, in a
        container; which the provider knows from how it provisioned the node."""


class NodeRunner(ABC):
    """Runs the node agent on one node (SkyPilot's command runner, for the agent only):
    the interpreter there, and a start whose output comes back as lines. Capacity is the
    provider's; how a command reaches the node is the runner's."""

    # The interpreter that runs the agent on the node (the image's, when in a container).
    python: str

    @abstractmethod
    def start(self, argv: list[str], env: dict[str, str]) -> RunningProcess:
        """Start the agent `argv` with `env` (the job's tags are the runner's to add)."""

    def command(self, argv: list[str], env_names: set[str]) -> list[str]:
        """What `start` runs on the node for `argv` (a dry run shows it): the agent itself
        unless the runner wraps it (an engine command that runs it in the job's image)."""
        return argv


def make_cluster(
    request: CapacityRequest,
    job: str,
    attempt: int,
    provider: str,
    instance_type: str,
    nodes: list[NodeInfo],
    *,
    master_port: int = DEFAULT_MASTER_PORT,
    gpus: int | None = None,
    network_env: dict[str, str] | None = None,
    market: Literal["spot", "on-demand"] | None = None,
    capacity_id: str | None = None,
) -> ClusterInfo:
    """The one place a ClusterInfo is made. Workers per node: the request's, else one per GPU
    (`gpus`: what every node has, default the instance type's), else one."""
    from trainctl.spec.catalog import CATALOG

    if gpus is None:
        known = CATALOG.get(instance_type)
        gpus = known.gpus if known else 0
    return ClusterInfo(
        job=job,
        attempt=attempt,
        provider=provider,
        instance_type=instance_type,
        nodes=nodes,
        master_port=master_port,
        processes_per_host=request.processes_per_host or gpus or 1,
        network_env=network_env or {},
        market=market,
        capacity_id=capacity_id,
    )


# -- capabilities: what some providers can do, checked with isinstance ---------------------


class Billing(ABC):
    """Capacity that costs money: each instance's billable time, and an estimate."""

    @abstractmethod
    def usage(self, job: str) -> list[InstanceUsage]:
        """Billable instance time of every attempt of `job` so far."""

    @abstractmethod
    def hourly_cost(self, request: CapacityRequest) -> float | None:
        """Expected USD per hour for `request`; None when there is no price."""


class WarmPools(ABC):
    """Nodes kept up after a job for the next one with the same capacity spec."""

    @abstractmethod
    def keep_warm(self, job: str, seconds: float) -> list[str]:
        """Keep the job's healthy nodes up `seconds` after it, instead of terminating
        them; the ids kept."""

    @abstractmethod
    def warm_start(self, job: str, attempt: int) -> WarmStart | None:
        """The warm pool the attempt's `provision` claimed, if it claimed one."""

    @abstractmethod
    def capacity_plan(self, request: CapacityRequest) -> str | None:
        """For a dry run: where the capacity would come from (e.g. a warm pool), found with
        read-only calls; None when there is nothing to say."""

    @abstractmethod
    def release_left_by(
        self, request: CapacityRequest, jobs: list[str]
    ) -> list[tuple[str, list[InstanceUsage]]]:
        """End the warm pools that `jobs` left and no job claimed (in `request`'s region):
        each leaving job with the idle time its instances were billed for."""


class CapacityProbe(ABC):
    """Knows, without launching, how many nodes it could provision now."""

    @abstractmethod
    def available_nodes(self, request: CapacityRequest, job: str) -> int | None:
        """How many nodes of `request`'s type `provision` could have now (None: cannot
        tell)."""


class SpotOutlook(ABC):
    """Can say, without launching, whether spot capacity for a request is likely there now,
    where it cannot count it (EC2's spot placement scores and price history). A CapacityProbe
    answers the same question from its count (trainctl.controller.recovery.spot_has_room)."""

    @abstractmethod
    def spot_outlook(self, request: CapacityRequest, job: str) -> bool | None:
        """True: a spot request for all of `request`'s nodes would likely be met now; False:
        likely not; None: cannot tell (no permission to ask, no answer for the type)."""


class FaultInjection(ABC):
    """Faults on demand (`faults`): a node taken away, capacity withheld."""

    @abstractmethod
    def kill_node(self, cluster: ClusterInfo, rank: int) -> None:
        """Take one node away without warning (a spot reclaim)."""

    def hold_capacity(self, job: str, nodes: int, seconds: float | None) -> None:
        """`nodes` fewer can be had for `seconds` (None: for good)."""
        raise NotImplementedError(
            f"the {getattr(self, 'name', '?')} provider cannot withhold capacity"
        )


@dataclass(frozen=True)
class ProviderPlugin:
    """A provider and the instance types that select it (each with `provider=name`), as the
    `trainctl.providers` entry point group names it: trainctl's own (local, ssh, aws) and
    those of plug-in packages alike."""

    name: str
    factory: Callable[[str | None], Provider]  # the job's region (None: the default)
    instance_types: tuple[InstanceType, ...] = field(default=())
    # The plug-in's own job options (a pydantic model, extra="forbid"): the keys of a job's
    # `<name>:` block, `--<name>-<option>` flags, `Estimator(<name>={...})`; a provider
    # reads them as `options.model_validate(request.provider_options.get(name, {}))`.
    options: type[BaseModel] | None = None
    # A module the provider needs installed (looked up without importing it), and what to
    # install for it: ("boto3", "trainctl[aws]").
    needs: tuple[str, str] | None = None
    api: int = PLUGIN_API

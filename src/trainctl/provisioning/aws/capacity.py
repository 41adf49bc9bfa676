"""Getting EC2 capacity: all nodes at once, falling back over subnets, types and markets.

One round tries every launch choice in order (each subnet/AZ, then the next instance type,
then, with on_demand_fallback, on-demand in the same order). A capacity error moves on to
the next choice; after a round without capacity, a backoff, until the call's retry_for
(the job's max_wait, or what is left of it, else aws_capacity_wait_seconds) is spent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainctl.errors import TrainctlError
from trainctl.provisioning.aws import requests as rq
from trainctl.provisioning.aws.clients import AwsError, Timing, error_code, error_message
from trainctl.provisioning.aws.lookups import scrub
from trainctl.provisioning.aws.resources import (
    GONE_STATES,
    describe_instances,
    state_of,
    terminate_instances,
)
from trainctl.provisioning.base import NoCapacityError
from trainctl.spec.request import CapacityRequest

# Errors that say "not here, not now": the next subnet, type or market may have capacity.
CAPACITY_ERRORS = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientCapacity",
        "InsufficientHostCapacity",
        "InsufficientReservedInstanceCapacity",
        "InsufficientFreeAddressesInSubnet",
        "SpotMaxPriceTooLow",
        "MaxSpotInstanceCountExceeded",
        "Unsupported",
        "VcpuLimitExceeded",
    }
)


class CapacityError(NoCapacityError):
    """No launch choice got capacity within the call's retry_for; says what was tried."""


@dataclass(frozen=True)
class Launched:
    choice: rq.LaunchChoice
    instances: list[dict[str, Any]]  # by rank (AmiLaunchIndex order), as last described


@dataclass
class Backoff:
    initial: float = 15.0
    maximum: float = 300.0

    def delay(self, failed_rounds: int) -> float:
        return min(self.initial * 2 ** (failed_rounds - 1), self.maximum)


class BootFailed(TrainctlError):
    """Launched, but some instance ended before running: counts as no capacity there."""


def launch(
    ec2: Any,
    ctx: rq.LaunchContext,
    request: CapacityRequest,
    choices: list[rq.LaunchChoice],
    *,
    timing: Timing,
    retry_for: float,
    boot_timeout: float,
    backoff: Backoff,
) -> Launched:
    """Run the nodes of one attempt with the first choice that has capacity; wait for running.
    On a terminal, a spinner says which round it is and what the last one was told."""
    from trainctl.progress import status

    what = f"EC2 capacity for {request.instance_count} x {'/'.join(request.instance_types)}"
    with status(what) as update:
        return _launch(ec2, ctx, request, choices, timing, retry_for, boot_timeout, backoff, update)


def _launch(
    ec2: Any,
    ctx: rq.LaunchContext,
    request: CapacityRequest,
    choices: list[rq.LaunchChoice],
    timing: Timing,
    retry_for: float,
    boot_timeout: float,
    backoff: Backoff,
    update: Any,
) -> Launched:
    start = timing.clock()
    deadline = start + retry_for
    tried: dict[rq.LaunchChoice, str] = {}
    round_ = 1
    while True:
        for choice in choices:
            params = rq.run_instances(ctx, request, choice, round_)
            try:
                response = ec2.run_instances(**params)
            except Exception as exc:
                code = error_code(exc)
                if code not in CAPACITY_ERRORS:
                    raise AwsError(
                        f"RunInstances ({choice.describe()}) failed: {code or type(exc).__name__}"
                        f": {scrub(error_message(exc))}"
                    ) from None
                tried[choice] = code
                continue
            instances = sorted(response["Instances"], key=lambda i: int(i.get("AmiLaunchIndex", 0)))
            tag_ranks(ec2, ctx, instances)
            try:
                ready = wait_running(
                    ec2, [str(i["InstanceId"]) for i in instances], timing, boot_timeout
                )
            except BootFailed as exc:
                tried[choice] = str(exc)
                continue
            return Launched(choice, ready)
        delay = backoff.delay(round_)
        if timing.clock() + delay > deadline:
            summary = ", ".join(f"{c.describe()} ({why})" for c, why in tried.items())
            waited = timing.clock() - start
            raise CapacityError(
                f"no EC2 capacity for {request.instance_count} x "
                f"{'/'.join(request.instance_types)} "
                f"in {ctx.region} after {round_} round(s) over {waited:.0f} s (retrying "
                f"for {retry_for:.0f} s); tried: {summary}"
            )
        last = ", ".join(f"{c.describe()}: {why}" for c, why in tried.items())
        update(f"round {round_} found none ({last}); next round in {delay:.0f} s")
        timing.sleep(delay)
        round_ += 1


def tag_ranks(ec2: Any, ctx: rq.LaunchContext, instances: list[dict[str, Any]]) -> None:
    for rank, instance in enumerate(instances):
        ec2.create_tags(**rq.rank_tags(ctx, str(instance["InstanceId"]), rank))


def wait_running(ec2: Any, ids: list[str], timing: Timing, timeout: float) -> list[dict[str, Any]]:
    """The instances (in `ids` order) once all run. An instance that ends first fails the lot:
    its peers are terminated (all or nothing) and BootFailed says why."""

    def check() -> list[dict[str, Any]] | None:
        try:
            found = {str(i["InstanceId"]): i for i in describe_instances(ec2, ids=ids)}
        except Exception as exc:
            if error_code(exc) == "InvalidInstanceID.NotFound":  # not yet visible (eventual)
                return None
            raise
        gone = [i for i in found.values() if state_of(i) in GONE_STATES]
        if gone:
            terminate_instances(ec2, ids)
            reason = gone[0].get("StateReason", {}).get("Code") or state_of(gone[0])
            raise BootFailed(f"{gone[0]['InstanceId']} ended before running: {reason}")
        if len(found) == len(ids) and all(state_of(i) == "running" for i in found.values()):
            return [found[i] for i in ids]
        return None

    try:
        return timing.poll_until(check, timeout=timeout, what="the nodes to run")
    except AwsError:
        terminate_instances(ec2, ids)
        raise

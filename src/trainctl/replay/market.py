"""Capacity for a replay: a spot market that follows a trace (trainctl.spec.trace), or a
pool with faults.

`TraceProvider` is a provider (with Billing and CapacityProbe) whose capacity is what the
trace says a zone had at the clock's time (trainctl.clock: a VirtualClock for a replay), and
which behaves as trainctl's EC2 provider does where the trace is silent:
- `provision` takes the job's nodes from the zone with the most; with none, it waits one
  capacity round (EC2's backoff, 15 s doubling to 300 s) and raises NoCapacityError, or,
  with `on_demand_fallback`, launches on demand (always there, never reclaimed); a job that
  is not on spot gets on-demand nodes; the instances take `boot_seconds` to boot, billed;
- `notice_seconds` before a zone's capacity falls below what an attempt holds, the nodes to
  be reclaimed (the highest ranks) get an interruption notice (AWS: 120 s);
- when it falls, `lost_nodes` reports them reclaimed, and their stand-in nodes
  (trainctl.replay.fleet) die with their machines;
- the bill is each node's time from launch at the trace's spot or on-demand price;
- `available_nodes` answers only with `probe`: EC2 cannot count its capacity without
  launching, so a replay of what trainctl does on EC2 leaves it off;
- `spot_outlook` answers as EC2's spot placement scores do (trainctl.provisioning.aws.outlook):
  whether a spot request for the job would be met now, from the trace, wrong with
  probability `outlook_error` (None: no answer, as for an account that may not ask). The
  wrong answers are drawn from the trace's time, per 5 minutes: the same inputs give the
  same replay.
The controller's decisions (relaunch, shrink, grow, wait, fall back) are its own.

A trace of `pool_size` instances drives a job of any size: each instance the trace saw
stands for `nodes_per_instance` of the job's nodes (a 64-node job on a 16-instance trace:
4), so a zone that had half its pool has half the job's nodes.
"""

from __future__ import annotations

import math
import random
import threading
from dataclasses import dataclass
from typing import Any

from trainctl.clock import clock
from trainctl.cluster import ClusterInfo
from trainctl.provisioning.base import (
    Billing,
    CapacityProbe,
    InstanceUsage,
    NoCapacityError,
    SpotOutlook,
)
from trainctl.replay.fleet import Fleet, FleetProvider
from trainctl.spec.trace import SpotTrace

SPOT, ON_DEMAND = "spot", "on-demand"
# How often a replay's spot outlook is wrong. AWS publishes no error rate for its placement
# scores ("highly likely, not guaranteed"); one answer in ten wrong is the replays' assumption,
# and `python -m bench.spot --outlook-error` measures others.
OUTLOOK_ERROR = 0.1


class TraceMarket:
    """The trace's capacity for a job, at the clock's time (from `start_s` into the trace)."""

    def __init__(self, trace: SpotTrace, nodes_per_instance: float = 1.0, start_s: float = 0):
        self.trace = trace
        self.nodes_per_instance = nodes_per_instance
        self.start_s = start_s
        self._began = clock().monotonic()

    def now_s(self) -> float:
        """Seconds into the trace."""
        return self.start_s + clock().monotonic() - self._began

    def capacity(self, zone: str) -> int:
        """How many of the job's nodes `zone` could give now."""
        return int(self.trace.available(zone, self.now_s()) * self.nodes_per_instance)

    def best_zone(self, ahead_s: float = 0.0) -> tuple[str, int]:
        """The zone with the most capacity now (the first such, by name), and how much; with
        `ahead_s`, the least it will have in that time (capacity about to be reclaimed, whose
        notices are out, is not offered)."""
        offers = (
            (zone, self.lowest(zone, ahead_s) if ahead_s else self.capacity(zone))
            for zone in self.trace.zones
        )
        return max(offers, key=lambda zc: zc[1])

    def lowest(self, zone: str, ahead_s: float) -> int:
        """The least `zone` will have in the next `ahead_s` seconds (what a notice foresees)."""
        now = self.now_s()
        lowest = self.trace.lowest(zone, now, now + ahead_s)
        return int(lowest * self.nodes_per_instance)


@dataclass
class _Held:
    """What one attempt of a job holds: its zone and market, its nodes, since when (until
    when), and whether they were given notice."""

    zone: str
    market: str
    nodes: int
    started: float
    ended: float | None = None
    noticed: bool = False


class TraceProvider(FleetProvider, Billing, CapacityProbe, SpotOutlook):
    name = "trace"

    def __init__(
        self,
        fleet: Fleet,
        market: TraceMarket,
        *,
        boot_seconds: float = 0.0,
        notice_seconds: float = 120.0,
        probe: bool = True,
        backoff: bool = False,
        outlook_error: float | None = None,
    ) -> None:
        super().__init__(fleet)
        self.market = market
        self.boot_seconds = boot_seconds
        self.notice_seconds = notice_seconds
        self.probe = probe
        self.backoff = backoff
        self.outlook_error = outlook_error
        self._failed_rounds = 0
        self._lock = threading.Lock()
        self._held: dict[str, dict[int, _Held]] = {}  # job -> attempt -> what it holds
        self._reported: set[tuple[int, int]] = set()  # (attempt, rank) reported reclaimed

    def provision(self, request: Any, job: str, attempt: int) -> ClusterInfo:
        count = request.instance_count
        zone, free = self.market.best_zone(self.notice_seconds)
        if not request.use_spot_instances:
            market = ON_DEMAND
        elif free >= count:
            market = SPOT
        elif request.on_demand_fallback:
            market = ON_DEMAND
        else:
            self._no_capacity_round(request)
            raise NoCapacityError(
                f"{zone} has {free} of the {count} node(s) asked for "
                f"({self.market.now_s():.0f} s into trace {self.market.trace.name})"
            )
        self._failed_rounds = 0
        with self._lock:
            self._held.setdefault(job, {})[attempt] = _Held(zone, market, count, clock().time())
        clock().sleep(self.boot_seconds)  # launched: billed while the instances boot
        return super().provision(request, job, attempt).model_copy(update={"market": market})

    def _no_capacity_round(self, request: Any) -> None:
        """One EC2 capacity round without capacity, and its backoff (at most the call's
        retry_for)."""
        if not self.backoff:
            return
        from trainctl.provisioning.aws.capacity import Backoff  # EC2's own (no boto3 import)

        self._failed_rounds += 1
        delay = Backoff().delay(self._failed_rounds)
        if request.retry_for is not None:
            delay = min(delay, float(request.retry_for))
        clock().sleep(delay)

    def lost_nodes(self, cluster: ClusterInfo) -> dict[int, str]:
        with self._lock:
            held = self._held.get(cluster.job, {}).get(cluster.attempt)
        if held is None or held.ended is not None or held.market != SPOT:
            return {}
        zone, count = held.zone, held.nodes
        if not held.noticed and self.notice_seconds > 0:
            soon = self.market.lowest(zone, self.notice_seconds)
            if soon < count:  # EC2's interruption notice, to the instances to be reclaimed
                held.noticed = True
                self.fleet.notify(cluster.attempt, range(soon, count))
        capacity = self.market.capacity(zone)
        if capacity >= count:
            return {}
        why = f"spot capacity reclaimed: {zone} has {capacity} of {count} node(s)"
        gone = {rank: why for rank in range(capacity, count)}
        for rank in gone:
            # The machine is gone, and its stand-in with it from the next look on (the
            # controller hears of the reclaim first, as from EC2's instance state)
            node = self.fleet.nodes.get((cluster.attempt, rank))
            if node is not None and (cluster.attempt, rank) in self._reported:
                node.kill()
            self._reported.add((cluster.attempt, rank))
        return gone

    def terminate(self, job: str, *, grace: float) -> None:
        super().terminate(job, grace=grace)
        with self._lock:
            for held in self._held.get(job, {}).values():
                if held.ended is None:
                    held.ended = clock().time()

    def available_nodes(self, request: Any, job: str) -> int | None:
        return self.market.best_zone()[1] if self.probe else None

    def spot_outlook(self, request: Any, job: str) -> bool | None:
        if self.outlook_error is None:
            return None
        now = self.market.now_s()
        truth = self.market.best_zone(self.notice_seconds)[1] >= request.instance_count
        draw = random.Random(f"{self.market.trace.name}:{int(now // 300)}").random()
        return truth if draw >= self.outlook_error else not truth

    def _price(self, market: str) -> float:
        prices = self.market.trace.prices
        return prices.spot_usd_per_hour if market == SPOT else prices.on_demand_usd_per_hour

    def usage(self, job: str) -> list[InstanceUsage]:
        with self._lock:
            held = dict(self._held.get(job, {}))
        return [
            InstanceUsage(
                attempt=attempt,
                rank=rank,
                instance_id=f"{job}-{attempt}-{rank}",
                instance_type=self.market.trace.instance_type,
                market=one.market,
                zone=one.zone,
                started=one.started,
                ended=one.ended,
                usd_per_hour=self._price(one.market),
            )
            for attempt, one in sorted(held.items())
            for rank in range(one.nodes)
        ]

    def hourly_cost(self, request: Any) -> float | None:
        market = SPOT if request.use_spot_instances else ON_DEMAND
        return request.instance_count * self._price(market)


class PoolProvider(FleetProvider, CapacityProbe):
    """`size` machines that are always there but for what an injected `nocapacity` fault
    withholds, and for how long: the local provider's capacity, for checking the model
    against a real run of the elastic benchmark (bench/elastic.py)."""

    name = "pool"

    def __init__(self, fleet: Fleet, size: int, boot_seconds: float = 0.0) -> None:
        super().__init__(fleet)
        self.size, self.boot_seconds = size, boot_seconds
        self._withheld: list[tuple[int, float]] = []  # (nodes, until)

    def _free(self) -> int:
        now = clock().monotonic()
        return self.size - sum(n for n, until in self._withheld if until > now)

    def hold_capacity(self, job: str, nodes: int, seconds: float | None) -> None:
        until = math.inf if seconds is None else clock().monotonic() + seconds
        self._withheld.append((nodes, until))

    def provision(self, request: Any, job: str, attempt: int) -> ClusterInfo:
        if request.instance_count > self._free():
            raise NoCapacityError(f"{self._free()} of {request.instance_count} node(s) free")
        clock().sleep(self.boot_seconds)
        return super().provision(request, job, attempt)

    def available_nodes(self, request: Any, job: str) -> int | None:
        return self._free()

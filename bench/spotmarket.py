"""A spot market that follows a trace (trainctl.spec.trace), for the real controller.

`TraceProvider` is a provider (with Billing and CapacityProbe) whose capacity is what the
trace says a zone had at the clock's time (trainctl.clock: a ScaledClock for a replay):
`provision` takes the job's nodes from the zone with the most, or raises NoCapacityError;
when that zone's capacity falls below what the job holds, `lost_nodes` reports the highest
ranks as reclaimed, and their stand-in nodes (bench/scale.py) die with their machines; the
bill is each node's time at the trace's spot price. The controller's decisions (relaunch,
shrink, grow, wait) are its own: nothing here makes them.

A trace of `pool_size` instances drives a job of any size: each instance the trace saw
stands for `nodes_per_instance` of the job's nodes (a 64-node job on a 16-instance trace:
4), so a zone that had half its pool has half the job's nodes.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from bench.scale import Harness, SimProvider
from trainctl.clock import clock
from trainctl.cluster import ClusterInfo
from trainctl.provisioning.base import Billing, CapacityProbe, InstanceUsage, NoCapacityError
from trainctl.spec.trace import SpotTrace


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

    def best_zone(self) -> tuple[str, int]:
        """The zone with the most capacity now (the first such, by name), and how much."""
        return max(((z, self.capacity(z)) for z in self.trace.zones), key=lambda zc: zc[1])


@dataclass
class _Held:
    """What one attempt of a job holds: its zone, its nodes, since when (until when)."""

    zone: str
    nodes: int
    started: float
    ended: float | None = None


class TraceProvider(SimProvider, Billing, CapacityProbe):
    name = "trace"

    def __init__(self, harness: Harness, market: TraceMarket) -> None:
        super().__init__(harness)
        self.market = market
        self._lock = threading.Lock()
        self._held: dict[str, dict[int, _Held]] = {}  # job -> attempt -> what it holds
        self._reported: set[tuple[int, int]] = set()  # (attempt, rank) reported reclaimed

    def provision(self, request: Any, job: str, attempt: int) -> ClusterInfo:
        zone, free = self.market.best_zone()
        if free < request.instance_count:
            raise NoCapacityError(
                f"{zone} has {free} of the {request.instance_count} node(s) asked for "
                f"({self.market.now_s():.0f} s into trace {self.market.trace.name})"
            )
        cluster = super().provision(request, job, attempt)
        with self._lock:
            self._held.setdefault(job, {})[attempt] = _Held(
                zone, request.instance_count, clock().time()
            )
        return cluster

    def lost_nodes(self, cluster: ClusterInfo) -> dict[int, str]:
        with self._lock:
            held = self._held.get(cluster.job, {}).get(cluster.attempt)
        if held is None or held.ended is not None:
            return {}
        zone, count = held.zone, held.nodes
        capacity = self.market.capacity(zone)
        if capacity >= count:
            return {}
        why = f"spot capacity reclaimed: {zone} has {capacity} of {count} node(s)"
        gone = {rank: why for rank in range(capacity, count)}
        for rank in gone:
            # The machine is gone, and its stand-in with it from the next look on (the
            # controller hears of the reclaim first, as from EC2's instance state)
            node = self.harness.nodes.get((cluster.attempt, rank))
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
        return self.market.best_zone()[1]

    def usage(self, job: str) -> list[InstanceUsage]:
        price = self.market.trace.prices.spot_usd_per_hour
        with self._lock:
            held = dict(self._held.get(job, {}))
        return [
            InstanceUsage(
                attempt=attempt,
                rank=rank,
                instance_id=f"{job}-{attempt}-{rank}",
                instance_type=self.market.trace.instance_type,
                market="spot",
                zone=one.zone,
                started=one.started,
                ended=one.ended,
                usd_per_hour=price,
            )
            for attempt, one in sorted(held.items())
            for rank in range(one.nodes)
        ]

    def hourly_cost(self, request: Any) -> float | None:
        return request.instance_count * self.market.trace.prices.spot_usd_per_hour

"""How a job gets capacity again, one `RecoveryStrategy` per way: what the next attempt asks
the provider for (`market`), and when an attempt on on-demand capacity checkpoints and
relaunches to try spot again (`leave_for_spot`). The controller asks `for_job(record)` before
each decision; the spot replay (trainctl.replay.strategies) runs the same classes under the
names and job fields each declares (`replayed`), so a strategy is defined here once.

The family, each a refinement of the one before:

- `AsAsked`: the request as the job's fields make it (on-demand, or spot relaunched at full
  size when it is reclaimed); never leaves its capacity by choice.
- `FallBackNow`: spot, with the provider falling back to on-demand at once when spot is
  short; after `spot_probe_seconds` of training on demand, a try back to spot (a try that
  finds none doubles the wait before the next, SPOT_PROBE_DOUBLINGS times at most).
- `FallBackAtDeadline`: with a max_wait, spot alone while the time left before it exceeds
  the training left and a start-up (STARTUP_ALLOWANCE_SECONDS), then the fallback; a try back
  to spot only while the deadline can afford two start-ups.
- `UniformProgress`: with the job's work known too (total_steps, or the script's
  report_step(total_steps=N)), Can't Be Late's rules (trainctl.controller.deadline); until its
  pace is measured, as `FallBackAtDeadline`.

Elastic sizing (`min_instance_count`: fewer nodes rather than none, larger again once there
is room) is the sizer's (trainctl.controller.capacity) and combines with any of them.

EC2 cannot be asked for spot capacity without launching, so a try back to spot costs a
relaunch either way: only a job whose relaunch resumes from saved state tries. A provider
that can be asked (`CapacityProbe`) is asked first, and a try is made only where it has room.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainctl.cluster import ClusterInfo
from trainctl.controller.deadline import Pace, decide, leave_on_demand
from trainctl.provisioning.base import CapacityProbe, Provider
from trainctl.record.jobstore import JobStore
from trainctl.record.models import JobRecord
from trainctl.spec.request import CapacityRequest
from trainctl.spec.settings import Settings

# What a relaunch takes before it trains (an EC2 GPU instance's boot, the rendezvous, the
# restore), kept in hand when deciding that the deadline leaves no more time to wait for spot.
STARTUP_ALLOWANCE_SECONDS = 600.0
# Tries back to spot that find none double the wait before the next, up to this many times.
SPOT_PROBE_DOUBLINGS = 3
# The deadline strategies' max_wait in a replay, in multiples of the on-demand time.
TIME_GOAL = 1.15


@dataclass
class RecoveryContext:
    """What a strategy decides with: the job, its provider and settings, the deadline's
    measures, and what it remembers between this controller's attempts."""

    provider: Provider
    jobs: JobStore
    record: JobRecord
    settings: Settings
    info: Callable[[str], None]
    # Seconds the job can still spend not training and finish by its max_wait (None: none).
    deadline_slack: Callable[[], float | None]
    # Where the job stands against its deadline, once its work and pace are known.
    pace: Callable[[], Pace | None]
    policy: str | None = None  # Uniform Progress's last word (deadline.decide)
    fell_back: bool = False  # the deadline's fallback was said
    trying_spot: bool = False  # the next attempt is a try back to spot
    spot_misses: int = 0  # tries back to spot in a row that found none

    def spot_probe_wait(self) -> float:
        doublings = min(self.spot_misses, SPOT_PROBE_DOUBLINGS)
        return self.settings.spot_probe_seconds * 2**doublings

    def after_provision(self, cluster: ClusterInfo, attempt: int) -> None:
        """Count a try back to spot by what it found (on-demand again: a miss)."""
        if not self.trying_spot:
            return
        self.trying_spot = False
        back = cluster.market != "on-demand"
        self.spot_misses = 0 if back else self.spot_misses + 1
        self.jobs.event("spot_probe", attempt=attempt, found=back, misses=self.spot_misses)
        if back:
            self.info(f"attempt {attempt}: back on spot capacity")
        else:
            self.info(
                f"attempt {attempt}: spot is still short; on demand again, trying spot "
                f"after {self.spot_probe_wait() / 60:.0f} min more training"
            )


@dataclass(frozen=True)
class Replayed:
    """A strategy as the spot replay runs it: a name and words for its table, the job fields
    that select it, and whether the job says its work (total_steps)."""

    name: str
    title: str
    fields: dict[str, Any]
    knows_work: bool = False


class RecoveryStrategy:
    """The request as the job's fields make it; no relaunch by choice."""

    def market(self, ctx: RecoveryContext, request: CapacityRequest) -> CapacityRequest:
        """What the next attempt asks the provider for."""
        return request

    def leave_for_spot(
        self, ctx: RecoveryContext, cluster: ClusterInfo, trained_for: float, saved: bool
    ) -> str | None:
        """Why an attempt on on-demand capacity (its fallback), `trained_for` seconds into
        its training, should checkpoint now and relaunch to try spot; None while it should
        not. `saved`: a relaunch resumes from saved state, not from scratch."""
        return None

    @classmethod
    def replayed(cls, nodes: int, hours: float) -> list[Replayed]:
        """The replay's strategies of this kind, for a job of `nodes` and `hours`."""
        return []


class AsAsked(RecoveryStrategy):
    @classmethod
    def replayed(cls, nodes: int, hours: float) -> list[Replayed]:
        spot = {"use_spot_instances": True, "max_run": 14 * 86400, "max_wait": 28 * 86400}
        return [
            Replayed("on-demand", "on-demand only", {"max_run": 14 * 86400}),
            Replayed("spot", "spot, relaunch at full size", spot),
            Replayed("elastic", "spot + elastic (down to half)", {**spot, **_elastic(nodes)}),
        ]


class FallBackNow(RecoveryStrategy):
    def leave_for_spot(
        self, ctx: RecoveryContext, cluster: ClusterInfo, trained_for: float, saved: bool
    ) -> str | None:
        if not self._may_try(ctx, cluster, saved) or trained_for < ctx.spot_probe_wait():
            return None
        why = f"trying spot again after {trained_for / 60:.0f} min on demand"
        return self._try_spot(ctx, cluster, why)

    @staticmethod
    def _may_try(ctx: RecoveryContext, cluster: ClusterInfo, saved: bool) -> bool:
        return cluster.market == "on-demand" and bool(ctx.settings.spot_probe_seconds) and saved

    @staticmethod
    def _try_spot(ctx: RecoveryContext, cluster: ClusterInfo, why: str) -> str | None:
        """`why`, and the next attempt a try back to spot; None where a provider that can be
        asked says spot has no room for the job."""
        if isinstance(ctx.provider, CapacityProbe):
            request = CapacityRequest.of(ctx.record.spec).spot_only()
            try:
                spot = ctx.provider.available_nodes(request, ctx.record.name)
            except Exception:  # asking is best effort: the next check asks again
                return None
            if spot is not None and spot < len(cluster.nodes):
                return None
        ctx.trying_spot = True
        return why

    @classmethod
    def replayed(cls, nodes: int, hours: float) -> list[Replayed]:
        fields = {"use_spot_instances": True, "on_demand_fallback": True, "max_run": 14 * 86400}
        return [Replayed("fallback-now", "spot + on-demand fallback at once, back to spot", fields)]


class FallBackAtDeadline(FallBackNow):
    def market(self, ctx: RecoveryContext, request: CapacityRequest) -> CapacityRequest:
        if ctx.trying_spot:
            return request  # spot if it is back, else on-demand at once
        slack = ctx.deadline_slack()
        if slack is None:
            return request  # (no max_wait) the provider falls back at once
        if slack > STARTUP_ALLOWANCE_SECONDS:
            return request.spot_only()
        if not ctx.fell_back:
            ctx.fell_back = True
            ctx.jobs.event("on_demand_fallback", slack_seconds=round(slack))
            ctx.info(
                f"falling back to on-demand capacity if spot is short: {max(0.0, slack):.0f} s "
                "of slack left before max_wait"
            )
        return CapacityRequest.of(ctx.record.spec)

    def leave_for_spot(
        self, ctx: RecoveryContext, cluster: ClusterInfo, trained_for: float, saved: bool
    ) -> str | None:
        slack = ctx.deadline_slack()
        if slack is not None and slack < 2 * STARTUP_ALLOWANCE_SECONDS:
            return None  # a try that finds no spot would cost the deadline its start-up
        return super().leave_for_spot(ctx, cluster, trained_for, saved)

    @classmethod
    def replayed(cls, nodes: int, hours: float) -> list[Replayed]:
        fields = _deadline(hours)
        return [
            Replayed("fallback", "spot + on-demand fallback at the deadline", fields),
            Replayed(
                "elastic-fallback",
                "spot + elastic + on-demand fallback at the deadline",
                {**fields, **_elastic(nodes)},
            ),
        ]


class UniformProgress(FallBackAtDeadline):
    def market(self, ctx: RecoveryContext, request: CapacityRequest) -> CapacityRequest:
        pace = ctx.pace()
        if ctx.trying_spot or pace is None:
            return super().market(ctx, request)
        market = decide(pace)
        if market != ctx.policy:
            ctx.policy = market
            _say_policy(ctx, pace, market)
        if market == "spot":
            return request.spot_only()
        if market == "on-demand":
            return request.on_demand_only()
        return request

    def leave_for_spot(
        self, ctx: RecoveryContext, cluster: ClusterInfo, trained_for: float, saved: bool
    ) -> str | None:
        pace = ctx.pace()
        if pace is None:
            return super().leave_for_spot(ctx, cluster, trained_for, saved)
        # The hysteresis: ahead of the line two restarts on; after a try that found no
        # spot, the probe's wait too.
        if not self._may_try(ctx, cluster, saved) or not leave_on_demand(pace):
            return None
        if ctx.spot_misses and trained_for < ctx.spot_probe_wait():
            return None
        ahead = (pace.done - pace.expected(pace.elapsed)) / 60
        why = (
            f"trying spot again after {trained_for / 60:.0f} min on demand: "
            f"{ahead:.0f} min ahead of the deadline's line"
        )
        return self._try_spot(ctx, cluster, why)

    @classmethod
    def replayed(cls, nodes: int, hours: float) -> list[Replayed]:
        title = "spot + on-demand by Uniform Progress (work known)"
        return [Replayed("uniform-progress", title, _deadline(hours), knows_work=True)]


FAMILY: tuple[type[RecoveryStrategy], ...] = (
    AsAsked,
    FallBackNow,
    FallBackAtDeadline,
    UniformProgress,
)


def for_job(record: JobRecord) -> RecoveryStrategy:
    """The strategy the job's fields (and what it has said of its work) select."""
    spec = record.spec
    if not (spec.use_spot_instances and spec.on_demand_fallback):
        return AsAsked()
    if spec.max_wait is None:
        return FallBackNow()
    if record.total_steps is None:
        return FallBackAtDeadline()
    return UniformProgress()


def replayed(nodes: int, hours: float = 6.0) -> list[Replayed]:
    """Every strategy the spot replay runs, in the order of its tables."""
    found = {r.name: r for kind in FAMILY for r in kind.replayed(nodes, hours)}
    order = ["on-demand", "spot", "elastic", "fallback", "fallback-now", "elastic-fallback"]
    return [found[name] for name in order] + [r for n, r in found.items() if n not in order]


def _elastic(nodes: int) -> dict[str, Any]:
    return {"min_instance_count": max(1, nodes // 2)}


def _deadline(hours: float) -> dict[str, Any]:
    """A deadline: max_wait TIME_GOAL x the training on demand, max_run 1.05x (what the
    training needs, saves included, with room: the sizer keeps the rest of max_run in hand)."""
    return {
        "use_spot_instances": True,
        "on_demand_fallback": True,
        "max_run": math.ceil(1.05 * hours * 3600),
        "max_wait": math.ceil(TIME_GOAL * hours * 3600),
    }


def _say_policy(ctx: RecoveryContext, pace: Pace, market: str) -> None:
    behind = pace.expected(pace.elapsed) - pace.done
    ctx.jobs.event(
        "deadline_policy",
        market=market,
        behind_seconds=round(behind),
        left_seconds=round(pace.left),
        deadline_in_seconds=round(pace.deadline - pace.elapsed),
    )
    where = f"{abs(behind) / 60:.0f} min {'behind' if behind > 0 else 'ahead of'}"
    ctx.info(
        f"deadline policy: {market} ({where} the line to the deadline, "
        f"{pace.left / 60:.0f} min of training left)"
    )

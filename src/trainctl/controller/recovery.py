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

A try back to spot costs a relaunch whether it finds spot or not: only a job whose relaunch
resumes from saved state tries, and a provider that can be asked without launching is asked
first (`spot_has_room`: a CapacityProbe's count, a SpotOutlook's forecast such as EC2's spot
placement scores), at most every ASK_SECONDS; a try is made only where the answer is good.
Where the provider answers, a try need not wait out spot_probe_seconds (a blind try's price):
it waits ASKED_PROBE_SECONDS, doubled after each try the answer misled, and Uniform Progress
tries whenever its deadline can afford one more restart (trainctl.controller.deadline).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainctl.clock import clock
from trainctl.cluster import ClusterInfo
from trainctl.controller.deadline import Pace, affords_try, decide, leave_on_demand
from trainctl.provisioning.base import CapacityProbe, Provider, SpotOutlook
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
# A provider that can be asked about spot is asked at most this often (EC2's placement
# scores are an API call, rate-limited per account), and the answer is kept as long.
ASK_SECONDS = 300.0
# Where the provider answers, the least training on demand before a try back to spot (the
# answer said room; a try it misled doubles this, as a blind try doubles spot_probe_seconds).
ASKED_PROBE_SECONDS = 600.0


def spot_has_room(
    provider: Provider, request: CapacityRequest, job: str, nodes: int
) -> bool | None:
    """Whether spot has room for `nodes` of `request`'s type now, asked without launching: a
    CapacityProbe's count, else a SpotOutlook's forecast; None where the provider cannot tell."""
    if isinstance(provider, CapacityProbe):
        count = provider.available_nodes(request, job)
        if count is not None:
            return count >= nodes
    if isinstance(provider, SpotOutlook):
        return provider.spot_outlook(request, job)
    return None


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
    answered: bool = False  # the provider has answered whether spot has room
    _asked: tuple[float, bool | None] | None = None  # when, and what it said

    def spot_probe_wait(self, asked: bool) -> float:
        """The training on demand before a try back to spot: spot_probe_seconds for a blind
        try, less where the provider said spot has room (`asked`); doubled by each miss."""
        doublings = min(self.spot_misses, SPOT_PROBE_DOUBLINGS)
        base = self.settings.spot_probe_seconds
        if asked:
            base = min(base, ASKED_PROBE_SECONDS)
        return base * 2**doublings

    def spot_answer(self, nodes: int) -> bool | None:
        """Whether the provider says spot has room for `nodes` (None: it cannot tell, or
        asking failed), asked at most every ASK_SECONDS."""
        now = clock().monotonic()
        if self._asked is not None and now - self._asked[0] < ASK_SECONDS:
            return self._asked[1]
        request = CapacityRequest.of(self.record.spec).spot_only()
        try:
            answer = spot_has_room(self.provider, request, self.record.name, nodes)
        except Exception:  # asking is best effort: the next check asks again
            answer = None
        self._asked = (now, answer)
        self.answered = self.answered or answer is not None
        return answer

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
                f"after {self.spot_probe_wait(self.answered) / 60:.0f} min more training"
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
        if not self._may_try(ctx, cluster, saved) or trained_for < ctx.spot_probe_wait(True):
            return None
        answered = ctx.spot_answer(len(cluster.nodes)) is not None
        if not answered and trained_for < ctx.spot_probe_wait(False):
            return None
        return self._try_spot(
            ctx, cluster, f"trying spot again after {trained_for / 60:.0f} min on demand"
        )

    @staticmethod
    def _may_try(ctx: RecoveryContext, cluster: ClusterInfo, saved: bool) -> bool:
        return cluster.market == "on-demand" and bool(ctx.settings.spot_probe_seconds) and saved

    @staticmethod
    def _try_spot(ctx: RecoveryContext, cluster: ClusterInfo, why: str) -> str | None:
        """`why`, and the next attempt a try back to spot; None where the provider, asked,
        says spot has no room for the job."""
        if ctx.spot_answer(len(cluster.nodes)) is False:
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
        # spot, the probe's wait too. Where the provider says spot has room, a try costs a
        # restart and little risk: made whenever the deadline can afford one more.
        if not self._may_try(ctx, cluster, saved):
            return None
        asked = ctx.spot_answer(len(cluster.nodes)) if affords_try(pace) else None
        if not (leave_on_demand(pace) or asked):
            return None
        if ctx.spot_misses and trained_for < ctx.spot_probe_wait(bool(asked)):
            return None
        ahead = (pace.done - pace.expected(pace.elapsed)) / 60
        where = f"{abs(ahead):.0f} min {'ahead of' if ahead >= 0 else 'behind'} the deadline's line"
        why = f"trying spot again after {trained_for / 60:.0f} min on demand: {where}"
        return self._try_spot(ctx, cluster, why + ("; spot said to have room" if asked else ""))

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
        "max_wait": deadline_max_wait(hours),
    }


def deadline_max_wait(hours: float) -> int:
    """The deadline strategies' max_wait for `hours` of training on demand: TIME_GOAL x."""
    return math.ceil(TIME_GOAL * hours * 3600)


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

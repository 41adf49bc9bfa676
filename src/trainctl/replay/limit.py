"""The limit: the cheapest any policy could run a job against a trace, seeing it all ahead.

An omniscient policy knows, at every start, when each zone will have spot capacity for the
whole job and for how long. Over the trace's 5-minute steps (`TICK_SECONDS`) it chooses, step
by step, to wait (nothing billed), to run on on-demand capacity, or to run on spot in a zone
whose capacity holds the job for the whole step; every change of capacity costs what a
relaunch costs the replayed job (boot, rendezvous, restore, and the checkpoint that leaving
saves: the workload's figures), and training makes progress at the job's pace less its
checkpoint stalls. `cheapest` finds the schedule of least cost that finishes the job's work by
its deadline (the deadline strategies' max_wait), by dynamic programming over the steps with,
for each capacity, the states that no other beats on both progress and cost.

It runs the job at full size (no elastic sizing) and leaves spot only at a step's boundary,
before a drop (with the foresight a notice gives, it loses nothing): a policy that shrinks, or
that uses the minutes of a step before a drop, can cost a little less than this limit on some
starts. Costs are the trace's prices, as in the replays.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainctl.replay.training import Workload
from trainctl.spec.trace import SpotTrace

TICK_SECONDS = 300.0  # the traces' probe interval (bench/traces/README.md)
WAIT, ON_DEMAND = "wait", "on-demand"


@dataclass(frozen=True)
class Limit:
    """The omniscient policy's run from one start: its cost, its time from submission to the
    end of training, its node-hours by market, and how many times it started capacity."""

    cost_usd: float
    hours: float
    spot_node_hours: float
    on_demand_node_hours: float
    starts: int


@dataclass(frozen=True)
class _State:
    progress: float  # seconds of full-size training kept
    cost: float
    spot_s: float  # billed seconds of the whole job on spot
    on_demand_s: float
    starts: int


def cheapest(
    trace: SpotTrace,
    workload: Workload,
    interval_seconds: float,
    *,
    start_s: float,
    deadline_s: float,
) -> Limit | None:
    """The least-cost schedule of waiting, spot (per zone) and on-demand from `start_s` into
    the trace that trains `workload`'s whole work within `deadline_s` of submission; None if
    not even on-demand from the first step could (a deadline shorter than the work)."""
    nodes = workload.nodes
    per_instance = nodes / trace.pool_size
    spot_rate = trace.prices.spot_usd_per_hour * nodes / 3600  # $ a second, whole job
    on_demand_rate = trace.prices.on_demand_usd_per_hour * nodes / 3600
    work = workload.on_demand_hours * 3600
    pace = interval_seconds / (interval_seconds + workload.save_seconds) if interval_seconds else 1
    first = workload.boot_seconds + workload.bootstrap_seconds
    again = first + workload.restore_seconds + workload.save_seconds

    frontier: dict[str, list[_State]] = {WAIT: [_State(0.0, 0.0, 0.0, 0.0, 0)]}
    best: tuple[float, float, _State] | None = None  # (cost, finished at, state)
    for step in range(math.ceil(deadline_s / TICK_SECONDS)):
        elapsed = step * TICK_SECONDS
        at = start_s + elapsed
        capacities = [ON_DEMAND] + [
            zone
            for zone in trace.zones
            if trace.lowest(zone, at, at + TICK_SECONDS - 1e-3) * per_instance >= nodes
        ]
        grown: dict[str, list[_State]] = {WAIT: []}
        for mode, states in frontier.items():
            for state in states:
                grown[WAIT].append(state)
                for capacity in capacities:
                    rate = on_demand_rate if capacity == ON_DEMAND else spot_rate
                    overhead = 0.0 if capacity == mode else (again if state.progress else first)
                    gain = (TICK_SECONDS - overhead) * pace
                    if state.progress + gain >= work:  # done within this step
                        used = overhead + (work - state.progress) / pace
                        done = _after(state, capacity, used, rate, capacity != mode)
                        if elapsed + used <= deadline_s and (best is None or done.cost < best[0]):
                            best = (done.cost, elapsed + used, done)
                        continue
                    after = _after(state, capacity, TICK_SECONDS, rate, capacity != mode)
                    grown.setdefault(capacity, []).append(
                        _State(state.progress + gain, *_rest(after))
                    )
        left = deadline_s - elapsed - TICK_SECONDS
        frontier = {
            mode: _undominated(
                s
                for s in states
                if _can_finish(work - s.progress, left, pace, _start_cost(mode, s, first, again))
            )
            for mode, states in grown.items()
        }
    if best is None:
        return None
    cost, finished, state = best
    return Limit(
        cost_usd=cost,
        hours=finished / 3600,
        spot_node_hours=state.spot_s * nodes / 3600,
        on_demand_node_hours=state.on_demand_s * nodes / 3600,
        starts=state.starts,
    )


def _after(state: _State, capacity: str, seconds: float, rate: float, starts: bool) -> _State:
    spot = capacity != ON_DEMAND
    return _State(
        state.progress,
        state.cost + rate * seconds,
        state.spot_s + (seconds if spot else 0.0),
        state.on_demand_s + (0.0 if spot else seconds),
        state.starts + (1 if starts else 0),
    )


def _rest(state: _State) -> tuple[float, float, float, int]:
    return state.cost, state.spot_s, state.on_demand_s, state.starts


def _start_cost(mode: str, state: _State, first: float, again: float) -> float:
    """What going on demand from `mode` costs before it trains (nothing if it is there)."""
    if mode == ON_DEMAND:
        return 0.0
    return again if state.progress else first


def _can_finish(work_left: float, time_left: float, pace: float, overhead: float) -> bool:
    """Whether on-demand from the next step (after `overhead` to start it) could still do the
    work left in the time left: a state that could not is no schedule's."""
    return work_left <= (time_left - overhead) * pace


def _undominated(states: object) -> list[_State]:
    """The states no other beats on both progress (more) and cost (less): the only ones a
    cheapest schedule can pass through (progress to the second, cost to the cent's hundredth)."""
    ordered = sorted(states, key=lambda s: (-round(s.progress), s.cost))  # type: ignore[attr-defined]
    kept: list[_State] = []
    for state in ordered:
        if not kept or state.cost < kept[-1].cost - 1e-4:
            kept.append(state)
    return kept

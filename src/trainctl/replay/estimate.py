"""`trainctl estimate`: what a job would take and cost under each spot strategy.

The job's own measured speed (its record: steps over training time, its start-up) becomes
a throughput model (trainctl.replay.training.Workload), which is replayed through the real
controller against a spot trace (a named one shipped with trainctl, or a file) from several
points of the trace, once per strategy; each is set against on-demand and against the limit
(trainctl.replay.limit: the cheapest any policy that saw the trace ahead could do from the
same start, by the same deadline). Prices are the trace's; for a job of another instance type,
its on-demand price (trainctl's catalog) with the trace's spot discount.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from trainctl.errors import SpecError
from trainctl.record.models import TO_FIRST_STEP, JobRecord
from trainctl.replay.training import Workload
from trainctl.spec.trace import SpotTrace, load_trace
from trainctl.store import Store

TRACES_DIR = Path(__file__).resolve().parent / "traces"
# What the record does not say: an EC2 GPU instance from launch to its agent, and a
# checkpoint's hold on training (trainctl diagnose measures it: --save-seconds)
EC2_BOOT_SECONDS = 120.0
SAVE_SECONDS = 5.0
DEFAULT_STARTUP_SECONDS = 60.0
# Shorter than this, a job meets no market: it starts and ends between two of a trace's rows.
MIN_TRAINING_SECONDS = 600.0


def trace_names() -> list[str]:
    """The traces shipped with trainctl (bench/traces/README.md says what each is)."""
    return sorted(p.stem for p in TRACES_DIR.glob("*.json"))


def open_trace(name: str) -> SpotTrace:
    """A shipped trace by name, or a trace file (a path, or a name ending in .json)."""
    if "/" in name or name.endswith(".json"):
        return load_trace(name)
    if name not in trace_names():
        raise SpecError(
            "--trace",
            f"no trace named {name!r}: one of {', '.join(trace_names())}, or a trace file "
            "(.json, see bench/traces/README.md for the format)",
        )
    return load_trace(TRACES_DIR / f"{name}.json")


class Spread(BaseModel):
    model_config = ConfigDict(extra="forbid")

    median: float
    min: float
    max: float


class StrategyEstimate(BaseModel):
    """One strategy over the trace's starts, against on-demand."""

    model_config = ConfigDict(extra="forbid")

    strategy: str
    title: str
    runs: int
    completed: int  # the figures are over these (None: no start completed)
    not_completed: list[str]  # why the others ended (max_run, max_wait)
    # and how each got there, attempt by attempt (`-o json`: the table says the first)
    not_completed_attempts: list[str] = []
    hours: Spread | None
    cost_usd: Spread | None
    time_ratio: Spread | None
    cost_ratio: Spread | None
    # each start's cost over the limit's from the same start (trainctl.replay.limit)
    limit_ratio: Spread | None = None
    wasted_node_hours: Spread | None
    relaunches: Spread | None
    on_demand_share: Spread | None
    # the share of the paid node-time that trained (trainctl.record.goodput, replayed)
    goodput: Spread | None = None


class Estimate(BaseModel):
    """A job's strategies side by side, against a trace."""

    model_config = ConfigDict(extra="forbid")

    job: str
    trace: str
    trace_source: str
    instance_type: str
    nodes: int
    on_demand_hours: float  # training at full size, on demand
    step_seconds: float
    checkpoint_interval_seconds: float
    on_demand_usd_per_hour: float
    spot_usd_per_hour: float
    starts: int
    strategies: list[StrategyEstimate]

    def render(self, width: int | None = None, *, head: bool = True, body: bool = True) -> str:
        """The estimate as text; with `width` (a terminal's columns), fitted to it: prose
        wrapped, and the strategy table, where it is wider, as one block per strategy.
        `head`: the job and trace lines (known before the replays: printed at once),
        `body`: the strategies' table."""

        def cell(s: Spread | None, fmt: str) -> str:
            if s is None:
                return "-"
            low, high = format(s.min, fmt), format(s.max, fmt)
            if low == high:
                return format(s.median, fmt)
            return f"{format(s.median, fmt)} [{low}-{high}]"

        interval = self.checkpoint_interval_seconds
        checkpoints = (
            f"a checkpoint every {interval / 60:.0f} min and at each notice"
            if interval < self.on_demand_hours * 3600
            else "checkpoints at notices only (a periodic one is not worth its cost)"
        )
        lines = [
            f"{self.job}: {self.nodes} x {self.instance_type}, {self.on_demand_hours:.1f} h of "
            f"training on demand ({self.step_seconds:.3g} s a step, measured), {checkpoints}",
            f"against {self.trace} ({self.trace_source}), from {self.starts} point(s) of it; "
            f"${self.on_demand_usd_per_hour:.4g}/h on demand, ${self.spot_usd_per_hour:.4g}/h "
            "spot; median [min-max]",
        ]
        header = (
            "strategy", "hours", "time x", "cost $", "cost x", "x limit", "wasted node-h",
            "relaunch", "goodput",
        )  # fmt: skip
        rows = [
            (
                r.title,
                cell(r.hours, ".2f"),
                cell(r.time_ratio, ".2f"),
                cell(r.cost_usd, ",.0f"),
                cell(r.cost_ratio, ".2f"),
                cell(r.limit_ratio, ".2f"),
                cell(r.wasted_node_hours, ".0f"),
                cell(r.relaunches, ".0f"),
                cell(r.goodput, ".0%"),
            )
            for r in self.strategies
        ]
        widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
        table = [
            "  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=True)).rstrip()
            for row in [header, *rows]
        ]
        if width is not None and max(len(line) for line in table) > width:
            table = []  # a block per strategy: its title, then its figures named
            for row in rows:
                table.append(row[0])
                table.append("  " + " · ".join(f"{name} {value}" for name, value in zip(
                    header[1:], row[1:], strict=True
                )))  # fmt: skip
        ended = [
            f"{r.title}: {r.runs - r.completed} of {r.runs} start(s) did not complete "
            f"(not in the figures): {'; '.join(sorted(set(r.not_completed)))}"
            for r in self.strategies
            if r.completed < r.runs
        ]
        out = ([line.rstrip() for line in lines] if head else []) + (
            ["", *table, *ended] if body else []  # (the blank line before the table is its)
        )
        if width is None:
            return "\n".join(out)
        import textwrap

        wrapped = []
        for line in out:
            indent = " " * (len(line) - len(line.lstrip()))
            wrapped += textwrap.wrap(
                line, width, subsequent_indent=indent + "  ", break_long_words=False
            ) or [""]
        return "\n".join(wrapped)


def measured_speed(record: JobRecord) -> tuple[float, float]:
    """Seconds a step and seconds of start-up, from what the job's attempts reported."""
    steps = seconds = 0.0
    startups = []
    for attempt in record.attempts:
        done = (attempt.last_step or 0) - (attempt.resumed_from_step or 0)
        if done > 0 and attempt.training_seconds:
            steps += done
            seconds += attempt.training_seconds
        if attempt.startup and TO_FIRST_STEP in attempt.startup:
            startups.append(attempt.startup[TO_FIRST_STEP])
    if steps <= 0:
        raise SpecError(
            "job",
            f"{record.name} reported no training steps to measure a speed from: run it (a "
            "script that reports steps: trainctl.train.report_step or the Checkpointer) first",
        )
    startup = min(startups) if startups else DEFAULT_STARTUP_SECONDS
    return seconds / steps, startup


# The estimate's clock moves 30 s at a time, not the benchmark's 10 s: 2.4x faster a replay
# (64 nodes on the 16-node trace: 5.3 s -> 2.2 s) at the same hours and cost within 0.4 %.
# (A minute, 4.4x, moved a 1-hour job with a 1.15x deadline from 1.072 h to 1.100 h, and one
# CI run saw it miss its max_wait: too coarse for tight deadlines.)
ESTIMATE_QUANTUM_SECONDS = 30.0


def estimate(
    job: str,
    trace: str,
    *,
    hours: float | None = None,
    nodes: int | None = None,
    instance_type: str | None = None,
    starts: int = 3,
    save_seconds: float = SAVE_SECONDS,
    store: Store | None = None,
    workers: int | None = None,
    on_replay: Callable[[str], None] | None = None,
    on_start: Callable[[Estimate, int], None] | None = None,
) -> Estimate:
    """The strategies for `job` (a job in the store: its speed is measured from its record)
    against `trace` (a shipped trace's name, or a trace file): `hours` of training on
    demand at full size (default: the job's own, once it completed), on `nodes` nodes
    (default: the job's; the measured step time is taken to hold at any size) of
    `instance_type` (default: the job's). The replays run `workers` at a time (default: four
    per CPU); `on_start` is given, once their processes have started, the estimate without
    its strategies (what is known before any replay ends: its head) and the number of
    replays; `on_replay` is told of each as it ends."""
    from trainctl.record.jobstore import JobStore
    from trainctl.replay.strategies import (
        Replay,
        recommended_interval,
        replay_all,
    )
    from trainctl.store import default_store

    _check_numbers(hours, nodes, starts, workers, save_seconds)
    market = open_trace(trace)
    record = JobStore(store or default_store(), job).load()
    kind = _priced_type(instance_type or record.spec.instance_type, market)
    step_seconds, startup = measured_speed(record)
    size = nodes or record.spec.instance_count
    hours = _training_hours(record, hours)
    workload = Workload(
        name=record.name,
        nodes=size,
        on_demand_hours=hours,
        compute_seconds=step_seconds,
        allreduce_seconds=0.0,
        samples_per_node_step=1,
        save_seconds=save_seconds,
        restore_seconds=0.0,  # in the measured start-up of a resumed attempt
        bootstrap_seconds=startup,
        boot_seconds=EC2_BOOT_SECONDS,
    )
    interval = recommended_interval(workload)
    jobs = _replays(market, workload, interval, starts)
    ended = itertools.count(1)
    known = {
        "job": record.name,
        "trace": market.name,
        "trace_source": market.source,
        "instance_type": kind,
        "nodes": size,
        "on_demand_hours": hours,
        "step_seconds": step_seconds,
        "checkpoint_interval_seconds": interval,
        "starts": starts,
    }

    def begin() -> None:
        if on_start is not None:
            on_start(Estimate(**known, **_prices(market, kind), strategies=[]), len(jobs))

    def done(job: Replay) -> None:
        if on_replay:
            on_replay(f"{next(ended)} of {len(jobs)} replays done ({job.describe()})")

    rows = replay_all(jobs, workers, on_done=done, on_begin=begin)
    strategies_rows = _strategy_rows(rows, _price_scale(market, kind))
    return Estimate(**known, **_prices(market, kind), strategies=strategies_rows)


def _strategy_rows(rows: list[dict[str, Any]], scale: float) -> list[Any]:
    """Each strategy's row over its replays, their costs scaled to the instance type's
    prices (`scale`: the replays price the trace's own)."""
    from trainctl.replay.strategies import summarize

    for row in rows:
        row["cost_usd"] *= scale
        if row.get("limit_usd") is not None:
            row["limit_usd"] *= scale
    return [_strategy_row(r) for r in summarize(rows)]


def _replays(market: SpotTrace, workload: Workload, interval: float, starts: int) -> list[Any]:
    """Every strategy from `starts` points spread over the trace (on-demand, which does not
    meet the market, from its start only)."""
    from trainctl.replay.strategies import Replay, strategies

    offsets = [round(i * market.duration_s / starts) for i in range(starts)]
    return [
        Replay(market, workload, strategy, interval, start, quantum=ESTIMATE_QUANTUM_SECONDS)
        for strategy in strategies(workload.nodes, workload.on_demand_hours)
        for start in (offsets if strategy.name != "on-demand" else offsets[:1])
    ]


def _check_numbers(
    hours: float | None, nodes: int | None, starts: int, workers: int | None, save_seconds: float
) -> None:
    for field, value in (("--hours", hours), ("--save-seconds", save_seconds)):
        if value is not None and not value > 0:
            raise SpecError(field, f"must be positive, not {value}")
    if nodes is not None and nodes < 1:
        raise SpecError("--nodes", f"must be at least 1, not {nodes}")
    if not 1 <= starts <= 50:
        raise SpecError("--starts", f"must be 1 to 50, not {starts}")
    if workers is not None and workers < 1:
        raise SpecError("--workers", f"must be at least 1, not {workers}")


def _priced_type(kind: str, market: SpotTrace) -> str:
    """`kind`, an EC2 type with an on-demand price (a spot estimate needs one)."""
    from trainctl.spec.catalog import CATALOG

    if kind not in CATALOG or not CATALOG[kind].on_demand_usd_per_hour:
        raise SpecError(
            "--instance-type",
            f"{kind!r} is not an EC2 instance type with a price in trainctl's catalog (a spot "
            f"estimate needs one): pass one, e.g. --instance-type {market.instance_type}",
        )
    return kind


def _training_hours(record: JobRecord, hours: float | None) -> float:
    """The hours the job trains on demand: `hours`, else the completed job's own."""
    if hours is None:
        trained = sum(a.training_seconds or 0.0 for a in record.attempts)
        if record.state.value != "Completed" or trained <= 0:
            raise SpecError("--hours", f"{record.name} has not completed: say how long it trains")
        hours = trained / 3600
    if hours * 3600 < MIN_TRAINING_SECONDS:
        raise SpecError(
            "--hours",
            f"{hours * 60:.1f} minutes of training is too short to replay against a trace (at "
            f"least {MIN_TRAINING_SECONDS / 60:.0f}): say how long the job trains on demand",
        )
    return hours


def _price_scale(market: SpotTrace, kind: str) -> float:
    """A job of another type than the trace's: its own on-demand price, the trace's spot
    discount (the factor on the trace's prices)."""
    from trainctl.spec.catalog import CATALOG

    own = CATALOG[kind].on_demand_usd_per_hour
    if kind != market.instance_type and own:
        return own / market.prices.on_demand_usd_per_hour
    return 1.0


def _prices(market: SpotTrace, kind: str) -> dict[str, float]:
    scale = _price_scale(market, kind)
    return {
        "on_demand_usd_per_hour": market.prices.on_demand_usd_per_hour * scale,
        "spot_usd_per_hour": market.prices.spot_usd_per_hour * scale,
    }


def _strategy_row(summary: dict[str, Any]) -> StrategyEstimate:
    from trainctl.replay.strategies import FIGURES

    keys = [k for k in FIGURES if k in StrategyEstimate.model_fields]
    return StrategyEstimate(
        strategy=summary["strategy"],
        title=summary["title"],
        runs=summary["runs"],
        completed=summary["completed"],
        not_completed=summary["not_completed"],
        not_completed_attempts=[s for s in summary.get("stories", []) if s],
        **{k: Spread(**summary[k]) if summary[k] else None for k in keys},
    )

"""A job under trainctl's spot strategies, side by side, against a trace's market.

Each strategy is a set of job fields (on-demand; spot relaunched at full size; spot +
elastic; spot + on-demand fallback at the deadline; both), replayed through the real
controller (`simulate`) on a simulated clock, its nodes training stand-ins
(trainctl.replay.training), its capacity the trace's market (trainctl.replay.market).
`replay` measures one from the job record and the training's account: time to
completion, cost (spot and on-demand hours at the trace's prices), node-hours wasted,
relaunches; `summarize` sets each against on-demand over the starts; `table` prints them.
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainctl.clock import VirtualClock, use_clock
from trainctl.controller.recovery import deadline_max_wait, replayed
from trainctl.replay.fleet import Fleet, run_job, settings_in_effect
from trainctl.replay.limit import Limit, cheapest
from trainctl.replay.market import OUTLOOK_ERROR, TraceMarket, TraceProvider
from trainctl.replay.training import (
    SILENT_NODE_LOST_SECONDS,
    STEP_REPORT_SECONDS,
    Training,
    TrainingNode,
    Workload,
)
from trainctl.spec.trace import SpotTrace
from trainctl.store import open_store

# Controller settings for a replay: heartbeats at rank 0's cadence, no node lost by silence;
# the lease renewed every 1,200 s, not 5 (a replay has no second controller to keep out, and
# the notices it relays are written at once: 810 of a 64-node replay's store writes were
# renewals, a quarter of its CPU, for the same figures; every 200 s, still 6 %).
REPLAY_SETTINGS = {
    "TRAINCTL_HEARTBEAT_SECONDS": str(STEP_REPORT_SECONDS),
    "TRAINCTL_HEARTBEAT_TIMEOUT_SECONDS": str(SILENT_NODE_LOST_SECONDS),
    "TRAINCTL_LOG_SYNC_SECONDS": "60",
    "TRAINCTL_LEASE_SECONDS": "3600",
    # (every 2 s, a save of the whole record each time rank 0 reported a step: a tenth of
    # a replay's CPU; the record's end is saved whole all the same)
    "TRAINCTL_PROGRESS_SAVE_SECONDS": "3600",
    # (a read of the store every 30-s quantum for a stop nobody asks for: 8 % of its CPU)
    "TRAINCTL_STOP_CHECK_SECONDS": "3600",
}
# Waits due within this many simulated seconds wake together (trainctl.clock.VirtualClock):
# the controller's 0.25 s poll is one wake per quantum, and hours replay in seconds.
QUANTUM_SECONDS = 10.0
FIXED_INTERVAL_SECONDS = 1800.0  # "save every 30 minutes"


@dataclass(frozen=True)
class Strategy:
    """One way to run a job on spot: a name, words for a table, the job's fields, and
    TRAINCTL_* settings for its controller (over the replay's own)."""

    name: str
    title: str
    fields: dict[str, Any]
    settings: dict[str, str] = field(default_factory=dict)
    # The job says its work (total_steps): the controller then follows Uniform Progress
    # (trainctl.controller.deadline) instead of falling back at the last moment.
    knows_work: bool = False


def strategies(nodes: int, hours: float = 6.0) -> list[Strategy]:
    """The strategies, as job fields: the controller's recovery strategies, each under the
    name and fields it declares (trainctl.controller.recovery.replayed)."""
    return [
        Strategy(r.name, r.title, r.fields, knows_work=r.knows_work) for r in replayed(nodes, hours)
    ]


def recommended_interval(workload: Workload) -> float:
    """What trainctl diagnose recommends for the stand-in's script, which checkpoints at an
    interruption notice (a PreemptionFlag): every reclaim of a trace comes with one and
    loses nothing, so only failures without notice size the interval, at the rate diagnose
    assumes for them on each of the job's nodes."""
    from trainctl.train.interval import policy_for

    # What the controller passes a new job's nodes, and what Checkpointer.due() takes from it
    # for a script that saves at notices: a replay's reclaims all lose nothing, so the job's
    # history keeps it where it starts.
    policy = policy_for([], nodes=workload.nodes, spot=True)
    return policy.interval_seconds(workload.save_seconds, saves_at_notice=True)


def simulate(
    workload: Workload,
    interval_seconds: float,
    provider_for: Callable[[Fleet], Any],
    *,
    faults: list[str] | None = None,
    fields: dict[str, Any] | None = None,
    recorded_as: dict[str, Any] | None = None,
    settings: dict[str, str] | None = None,
    quantum: float = QUANTUM_SECONDS,
) -> tuple[Any, Training, int]:
    """One job of `workload` under the real controller on a simulated clock, its nodes
    training stand-ins, its capacity `provider_for(harness)`; its record, its training's
    account, and how often the clock moved."""
    with (
        settings_in_effect({**REPLAY_SETTINGS, **(settings or {})}),
        tempfile.TemporaryDirectory(prefix="trainctl-replay-", dir=_memory_folder()) as tmp,
        use_clock(VirtualClock(quantum=quantum)) as virtual,
    ):
        fleet = Fleet(Path(tmp), open_store(f"file://{Path(tmp) / 'store'}"))
        fleet.node_class = TrainingNode
        training = Training(workload, interval_seconds)
        fleet.training = training  # type: ignore[attr-defined]
        done = run_job(
            fleet,
            workload.nodes,
            provider=provider_for(fleet),
            recorded_as=recorded_as,
            faults=faults or [],
            **(fields or {}),
        )
        return done["final"], training, virtual.advances


def _memory_folder() -> str | None:
    """A folder in memory for a replay's store (Linux's /dev/shm), where the machine has
    one: its few hundred small writes and renames cost a quarter of a replay's CPU on a
    disk's filesystem (a 64-node estimate: 21.6 -> 16.3 CPU-s); else the temp folder."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK) else None


def replay(
    trace: SpotTrace,
    workload: Workload,
    strategy: Strategy,
    *,
    interval_seconds: float,
    start_s: float = 0.0,
    notice_seconds: float = 120.0,
    quantum: float = QUANTUM_SECONDS,
    probe: bool = False,
    outlook_error: float | None = OUTLOOK_ERROR,
    settings: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One job, one strategy, from `start_s` into the trace; what it took and cost.
    `settings`: TRAINCTL_* values for the controller, over the replay's own; `outlook_error`:
    how often the market's answer to "has spot room?" is wrong (None: it gives none, as EC2
    without placement scores)."""

    wall = time.monotonic()

    def provider_for(fleet: Fleet) -> Any:
        market = TraceMarket(trace, workload.nodes / trace.pool_size, start_s=start_s)
        return TraceProvider(
            fleet,
            market,
            boot_seconds=workload.boot_seconds,
            notice_seconds=notice_seconds,
            probe=probe,
            backoff=True,
            outlook_error=outlook_error,
        )

    ec2 = {"instance_type": trace.instance_type, **strategy.fields}
    if strategy.knows_work:
        ec2["total_steps"] = workload.step(workload.total_samples)
    record, training, advances = simulate(
        workload,
        interval_seconds,
        provider_for,
        recorded_as=ec2,
        quantum=quantum,
        settings={**strategy.settings, **(settings or {})},
    )
    return {
        "trace": trace.name,
        "workload": workload.name,
        "nodes": workload.nodes,
        "strategy": strategy.name,
        "title": strategy.title,
        "interval_s": round(interval_seconds),
        "start_s": start_s,
        **_measured(record, training, workload),
        "outlook_error": outlook_error,
        "wall_s": time.monotonic() - wall,
        "clock_advances": advances,
    }


def _measured(record: Any, training: Training, workload: Workload) -> dict[str, Any]:
    """What a replayed job took and cost, from its record and its training's account."""
    # fsum: exact, so the same whatever order the instances were recorded in (a pool starts
    # an attempt's nodes side by side; a plain sum's last digits followed its order)
    spot_h = math.fsum(c.seconds for c in record.instances if c.market == "spot") / 3600
    od_h = math.fsum(c.seconds for c in record.instances if c.market != "spot") / 3600
    cost = math.fsum(c.seconds / 3600 * (c.usd_per_hour or 0.0) for c in record.instances)
    spent = training.node_seconds
    kept = spent["training"] - spent["redone"]
    billed = (spot_h + od_h) * 3600
    booted = workload.boot_seconds * sum(len(a.nodes) for a in record.attempts)
    return {
        "state": record.state.value,
        "hours": (record.duration_s or 0.0) / 3600,
        "cost_usd": cost,
        "spot_node_hours": spot_h,
        "on_demand_node_hours": od_h,
        "wasted_node_hours": (billed - kept) / 3600,
        "redone_node_hours": spent["redone"] / 3600,
        "restart_node_hours": (spent["restart"] + booted) / 3600,
        "checkpoint_node_hours": spent["checkpoint"] / 3600,
        # the share of the paid node-time that trained (record.goodput's, for a replay)
        "goodput": kept / billed if billed > 0 else None,
        "relaunches": max(0, len(record.attempts) - 1),
        "sizes": [len(a.nodes) for a in record.attempts],
        "causes": [a.resized or a.cause for a in record.attempts],
        "stop_reason": record.stop_reason,
        "story": None if record.state.value == "Completed" else story(record),
    }


def story(record: Any) -> str:
    """How a replayed job that did not complete got there: each attempt's start (simulated
    seconds into the job), its size, the steps it went from and to, and how it ended."""
    from trainctl.record.keys import parse_iso

    began = parse_iso(record.created_at)
    parts = [
        f"attempt {a.number} at {parse_iso(a.started_at) - began:.0f} s, {len(a.nodes)} node(s), "
        f"steps {a.resumed_from_step or 0}-{a.last_step or 0}: {a.outcome or 'running'}"
        + (f" ({a.cause})" if a.cause else "")
        for a in record.attempts
    ]
    return f"{record.stop_reason or record.state.value}: " + "; ".join(parts)


@dataclass(frozen=True)
class Replay:
    """One replay to run (picklable: `replay_all` runs it in a process of its own);
    `label` goes into its row as "interval" (which interval this is: recommended, fixed)."""

    trace: SpotTrace
    workload: Workload
    strategy: Strategy
    interval_seconds: float
    start_s: float = 0.0
    label: str = "recommended"
    quantum: float = QUANTUM_SECONDS
    outlook_error: float | None = OUTLOOK_ERROR

    def describe(self) -> str:
        days = self.start_s / 86400
        return f"{self.strategy.title}, {days:.1f} days into {self.trace.name}"


def run_replay(job: Replay) -> dict[str, Any]:
    from trainctl.progress import silenced

    with silenced():  # its jobs' packaging and uploads: not the user's to watch
        row = replay(
            job.trace,
            job.workload,
            job.strategy,
            interval_seconds=job.interval_seconds,
            start_s=job.start_s,
            quantum=job.quantum,
            outlook_error=job.outlook_error,
        )
    return {**row, "interval": job.label}


def replay_all(
    jobs: list[Replay],
    workers: int | None = None,
    on_done: Callable[[Replay], None] | None = None,
    on_begin: Callable[[], None] | None = None,
) -> list[dict[str, Any]]:
    """Every replay's row, in the order given, `workers` at a time (default: four per CPU) in
    processes of their own: each has its own simulated clock, so a busy machine slows a
    replay and does not change what it finds. `on_begin` is called once their processes are
    started (a progress bar's thread started before would be in each), `on_done` as each
    replay ends. Each row has the limit from its start (`limit_*`: trainctl.replay.limit),
    worked out once a start."""
    rows = _replayed(jobs, workers, on_done, on_begin)
    limits: dict[tuple[int, Workload, float, float], Limit | None] = {}
    for job, row in zip(jobs, rows, strict=True):
        key = (id(job.trace), job.workload, job.interval_seconds, job.start_s)
        if key not in limits:
            limits[key] = cheapest(
                job.trace,
                job.workload,
                job.interval_seconds,
                start_s=job.start_s,
                deadline_s=deadline_max_wait(job.workload.on_demand_hours),
            )
        limit = limits[key]
        row.update(
            limit_usd=limit.cost_usd if limit else None,
            limit_hours=limit.hours if limit else None,
            limit_on_demand_node_hours=limit.on_demand_node_hours if limit else None,
            limit_spot_node_hours=limit.spot_node_hours if limit else None,
            limit_starts=limit.starts if limit else None,
        )
    return rows


def replay_workers(replays: int, workers: int | None = None) -> int:
    """How many of `replays` run side by side: `workers`, or four per CPU. A replay's
    threads take turns, one at a time, and it waits between turns where the driver must see
    them all wait; on a busy machine each process gets its share of a core (the README's
    estimate on 2 cores at load 8: 43 s with 4 at a time, 33 s with 8, the same figures;
    13 s either way on a quiet machine). Forked, a worker costs about 50 MB and no imports."""
    return max(1, min(replays, workers or 4 * (os.cpu_count() or 1)))


def _replayed(
    jobs: list[Replay],
    workers: int | None,
    on_done: Callable[[Replay], None] | None,
    on_begin: Callable[[], None] | None,
) -> list[dict[str, Any]]:
    from concurrent.futures import ProcessPoolExecutor, as_completed

    workers = replay_workers(len(jobs), workers)
    if workers == 1:
        if on_begin:
            on_begin()
        rows = []
        for job in jobs:
            rows.append(run_replay(job))
            if on_done:
                on_done(job)
        return rows
    with ProcessPoolExecutor(
        workers, mp_context=_worker_start(), initializer=_end_with, initargs=(os.getpid(),)
    ) as pool:
        # (a pool forks its workers at the first submit, before its own threads start)
        futures = {pool.submit(run_replay, job): job for job in jobs}
        if on_begin:
            on_begin()
        for done in as_completed(futures):
            if on_done:
                on_done(futures[done])
        return [future.result() for future in futures]


def _worker_start() -> Any:
    """How the replays' processes start: forked from this process where that is safe (Linux,
    and no other thread here, whose locks a child could inherit held), with the replay's
    modules already imported; otherwise forked from a server that imports them once. (The
    server was 1.1 s of the README's estimate at load 8, before the first replay began:
    a second interpreter, its imports, on a fifth of a core.)"""
    import multiprocessing

    if sys.platform == "linux" and threading.active_count() == 1:
        return multiprocessing.get_context("fork")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["trainctl.replay.strategies", "trainctl.controller.controller"])
    return context


def _end_with(parent: int) -> None:
    """A replay worker ends with the process that asked for the replays: one killed outright
    (a test's timeout) left its workers, and a replay that hung in one, running for good."""

    # (os.kill, not trainctl.procs.alive: that reads /proc, which a Mac has not)
    def watch() -> None:
        while True:
            time.sleep(1.0)
            try:
                os.kill(parent, 0)
            except (ProcessLookupError, PermissionError):  # (its pid another user's by now)
                os._exit(1)

    threading.Thread(target=watch, name="replay-parent-watch", daemon=True).start()


def attempt_node_seconds(record: Any) -> float:
    from trainctl.record.keys import parse_iso

    return sum(
        len(a.nodes) * (parse_iso(a.ended_at) - parse_iso(a.started_at)) for a in record.attempts
    )


def spread(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    mid = len(ordered) // 2
    median = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    return {"median": median, "min": ordered[0], "max": ordered[-1]}


LIMIT = "omniscient"
LIMIT_TITLE = "the limit: omniscient, same deadline"
FIGURES = (
    "hours",
    "cost_usd",
    "time_ratio",
    "cost_ratio",
    "limit_ratio",
    "wasted_node_hours",
    "redone_node_hours",
    "relaunches",
    "on_demand_share",
    "goodput",
)


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per trace, size, strategy and interval: time and cost against on-demand (same trace,
    size and interval) and cost against the limit from the same start, over the starts whose
    job completed (None: none did); why the others ended. After each on-demand row, the
    limit's own (`omniscient`) over the starts the strategies ran from."""
    base = {
        (r["trace"], r["nodes"], r["interval"]): r for r in rows if r["strategy"] == "on-demand"
    }
    groups: dict[tuple[str, int, str, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["trace"], r["nodes"], r["strategy"], r["interval"]), []).append(r)
        if r["strategy"] != "on-demand" and r.get("limit_usd") is not None:
            limits = groups.setdefault((r["trace"], r["nodes"], LIMIT, r["interval"]), [])
            if all(one["start_s"] != r["start_s"] for one in limits):
                limits.append(_limit_row(r))
    out = []
    for (trace, nodes, strategy, interval), runs in groups.items():
        od = base[(trace, nodes, interval)]
        done = [
            {
                **r,
                "time_ratio": r["hours"] / od["hours"],
                "cost_ratio": r["cost_usd"] / od["cost_usd"],
                "limit_ratio": r["cost_usd"] / r["limit_usd"] if r.get("limit_usd") else None,
                "relaunches": float(r["relaunches"]),
                "on_demand_share": r["on_demand_node_hours"]
                / max(1e-9, r["on_demand_node_hours"] + r["spot_node_hours"]),
            }
            for r in runs
            if r["state"] == "Completed"
        ]
        out.append(
            {
                "trace": trace,
                "nodes": nodes,
                "strategy": strategy,
                "title": runs[0]["title"],
                "interval": interval,
                "interval_s": runs[0]["interval_s"],
                "runs": len(runs),
                "completed": len(done),
                "not_completed": [
                    r["stop_reason"] or r["state"] for r in runs if r["state"] != "Completed"
                ],
                "stories": [r.get("story") for r in runs if r["state"] != "Completed"],
                **{k: _spread_of([r[k] for r in done]) for k in FIGURES},
            }
        )
    order = list(groups)

    def place(r: dict[str, Any]) -> tuple[int, bool]:
        # the limit's row just after its trace, size and interval's on-demand row
        strategy = "on-demand" if r["strategy"] == LIMIT else r["strategy"]
        return order.index((r["trace"], r["nodes"], strategy, r["interval"])), r[
            "strategy"
        ] == LIMIT

    return sorted(out, key=place)


def _limit_row(r: dict[str, Any]) -> dict[str, Any]:
    """The limit from a replay's start, as a replay's row (trainctl.replay.limit)."""
    return {
        **{k: r[k] for k in ("trace", "workload", "nodes", "interval_s", "start_s", "interval")},
        "strategy": LIMIT,
        "title": LIMIT_TITLE,
        "state": "Completed",
        "hours": r["limit_hours"],
        "cost_usd": r["limit_usd"],
        "limit_usd": r["limit_usd"],
        "spot_node_hours": r["limit_spot_node_hours"],
        "on_demand_node_hours": r["limit_on_demand_node_hours"],
        "wasted_node_hours": None,
        "redone_node_hours": 0.0,
        "relaunches": max(0, r["limit_starts"] - 1),
        "goodput": None,  # (the limit's restarts are priced, not split by cause)
        "stop_reason": None,
    }


def _spread_of(values: list[float | None]) -> dict[str, float] | None:
    known = [v for v in values if v is not None]
    return spread(known) if known else None


def _cell(s: dict[str, float] | None, fmt: str) -> str:
    if s is None:
        return "-"
    low, high = format(s["min"], fmt), format(s["max"], fmt)
    if low == high:
        return format(s["median"], fmt)
    return f"{format(s['median'], fmt)} [{low}-{high}]"


def table(summary_rows: list[dict[str, Any]]) -> str:
    """The strategies side by side, per trace and size (markdown: the docs carry it); the
    figures are over the starts whose job completed."""
    lines = []
    for trace, nodes in dict.fromkeys((r["trace"], r["nodes"]) for r in summary_rows):
        lines += [
            "",
            f"**{trace}, {nodes} nodes**",
            "",
            "| strategy | checkpoint every | completed | hours | time x on-demand "
            "| cost x on-demand | cost x limit | wasted node-h | relaunches | on-demand share "
            "| goodput |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in summary_rows:
            if (r["trace"], r["nodes"]) != (trace, nodes):
                continue
            lines.append(
                f"| {r['title']} | {r['interval_s'] / 60:.0f} min ({r['interval']}) "
                f"| {r['completed']}/{r['runs']} "
                f"| {_cell(r['hours'], '.2f')} | {_cell(r['time_ratio'], '.2f')} "
                f"| {_cell(r['cost_ratio'], '.2f')} | {_cell(r['limit_ratio'], '.2f')} "
                f"| {_cell(r['wasted_node_hours'], '.0f')} "
                f"| {_cell(r['relaunches'], '.0f')} | {_cell(r['on_demand_share'], '.0%')} "
                f"| {_cell(r.get('goodput'), '.0%')} |"
            )
    return "\n".join(lines)

"""`trainctl diagnose JOB`: what bounds a job's throughput, measured by running it.

Determined's recipe for finding a data-parallel job's bottleneck, automated. The job's own
packaged source runs as short derived jobs (named `<job>-dx-<run>-<id>`, with its spec: the
same provider, instance type, hyperparameters), each for a bounded number of steps after a
warm-up (trainctl.train.diagnosis counts them through `report_step` and ends the run):

1. on the job's N nodes with its real data;
2. the same with synthetic data (`trainctl.train.batches` repeats the first batch): the
   difference is the data-loading (I/O) share;
3. on 1 node: with the per-worker batch, the step time N nodes add over 1 is the
   communication share (scaling efficiency = the 1-node rate x N vs. the N-node rate);
4. the checkpoint share is the time `Checkpointer.save` held the loop in run 1, at the
   script's own checkpoint interval; with the measured save time and an interruption rate,
   the Young/Daly interval sqrt(2 * C * MTBF) is the one that loses least.

A script that does not use the helpers still runs (1 and 3, each to its end or to
`max_seconds`): their wall times give the scaling efficiency, and the report says what
could not be measured. Derived jobs never read or write the job's checkpoints (a fresh
checkpoint location each), keep no warm capacity, and inject no faults.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict

from trainctl.errors import SpecError
from trainctl.record import JobRecord, JobStore, parse_iso
from trainctl.state import JobState
from trainctl.store import Store
from trainctl.train.diagnosis import DIAGNOSE_STEPS, DIAGNOSE_WARMUP, SYNTHETIC_DATA

__all__ = ["Diagnosis", "RunMeasurement", "diagnose"]

# A share of the step time above this bounds throughput (below it, compute does).
BOUND_SHARE = 0.15
# Interruptions per instance-hour assumed when the job's history has none: the Spot Instance
# Advisor's worst band (>20% of instances a month) for spot; a rare failure otherwise.
SPOT_INTERRUPTIONS_PER_HOUR = 0.2 / (30 * 24)
ON_DEMAND_INTERRUPTIONS_PER_HOUR = 0.01 / (30 * 24)


class RunMeasurement(BaseModel):
    """One diagnose run: a derived job and what it measured."""

    model_config = ConfigDict(extra="forbid")

    label: str  # "4 nodes", "4 nodes, synthetic data", "1 node"
    job: str
    nodes: int
    synthetic: bool
    state: str
    steps: int | None = None  # measured steps (None: the script reports none)
    seconds: float | None = None  # their wall time
    samples: int | None = None  # samples rank 0 drew in them (None: unknown)
    data_wait: float | None = None  # rank 0's wait for batches in them
    saves: int = 0
    checkpoint_stall: float | None = None
    checkpoint_write: float | None = None
    wall_seconds: float | None = None  # training start to end (scripts without helpers)
    ended_early: bool = False  # the script ended before the steps asked for
    note: str | None = None

    @property
    def step_seconds(self) -> float | None:
        if self.steps and self.seconds:
            return self.seconds / self.steps
        return None

    @property
    def samples_per_step(self) -> float | None:
        """Per worker (rank 0's, as every worker of a data-parallel job draws alike)."""
        if self.steps and self.samples:
            return self.samples / self.steps
        return None

    @property
    def samples_per_second(self) -> float | None:
        if self.samples and self.seconds:
            return self.samples * self.nodes / self.seconds
        return None


class Diagnosis(BaseModel):
    model_config = ConfigDict(extra="forbid")

    job: str
    nodes: int
    runs: list[RunMeasurement]
    scaling_efficiency: float | None = None
    communication_share: float | None = None
    io_share: float | None = None
    checkpoint_share: float | None = None
    bound: str = "unknown"  # communication | data loading | checkpointing | compute | unknown
    advice: list[str] = []
    not_measured: list[str] = []
    checkpoint: dict[str, float] | None = None  # the Young/Daly figures
    interruptions_from: str | None = None  # where the interruption rate came from

    def render(self) -> str:
        lines = [f"diagnosis of {self.job} ({self.nodes} node(s))", ""]
        for run in self.runs:
            if run.steps and run.step_seconds:
                rate = (
                    f", {run.samples_per_second:,.0f} samples/s" if run.samples_per_second else ""
                )
                what = f"{run.steps} steps, {run.step_seconds * 1000:.1f} ms/step{rate}"
                if run.ended_early:
                    what += " (the script ended: fewer steps than asked)"
            elif run.wall_seconds is not None:
                what = f"ran to its end in {run.wall_seconds:.1f} s (no steps reported)"
            else:
                what = run.note or run.state
            lines.append(f"  {run.label:<28} {what}   [{run.job}]")
        lines.append("")
        for name, value in (
            ("scaling efficiency", self.scaling_efficiency),
            ("communication share", self.communication_share),
            ("data loading share", self.io_share),
            ("checkpoint share", self.checkpoint_share),
        ):
            if value is not None:
                lines.append(f"  {name:<20} {value:6.1%}")
        lines += ["", f"bound by: {self.bound}"]
        lines += [f"  - {text}" for text in self.advice]
        if self.not_measured:
            lines += ["", "not measured:"]
            lines += [f"  - {text}" for text in self.not_measured]
        return "\n".join(lines)


def diagnose(
    job_name: str,
    *,
    store: Store | None = None,
    steps: int = 50,
    warmup: int = 5,
    nodes: int | None = None,
    interruptions_per_hour: float | None = None,
    max_seconds: int = 600,
    on_run: Callable[[str, str], None] | None = None,
) -> Diagnosis:
    """Run `job_name`'s script as bounded derived jobs and say what bounds its throughput.

    `nodes`: the data-parallel size to diagnose (default: the job's instance_count).
    `interruptions_per_hour`: per instance, for the checkpoint interval (default: the job's
    own history of interruptions, else an assumed rate for its market). `on_run(label,
    job)` is told as each run starts."""
    from trainctl.controller.submit import default_store

    _check_positive("steps", steps)
    _check_positive("max_seconds", max_seconds)
    if warmup < 0:
        raise SpecError("warmup", f"must be 0 or more, got {warmup}")
    if interruptions_per_hour is not None and not interruptions_per_hour > 0:
        raise SpecError("interruptions_per_hour", f"must be above 0, got {interruptions_per_hour}")
    store = store or default_store()
    record = JobStore(store, job_name).load()  # JobNotFoundError: one line, before any run
    size = record.spec.instance_count if nodes is None else nodes
    _check_positive("nodes", size)

    def run(label: str, count: int, synthetic: bool) -> RunMeasurement:
        tag = "syn" if synthetic else f"{count}n"
        name = _derived_name(job_name, tag)
        if on_run:
            on_run(label, name)
        return _run(store, record, name, label, count, synthetic, steps, warmup, max_seconds)

    many_label = f"{size} node{'s' if size > 1 else ''}"
    runs = [run(many_label, size, synthetic=False)]
    main = runs[0]
    if main.data_wait is not None:  # the script draws through `batches`: data can be swapped
        runs.append(run(f"{many_label}, synthetic data", size, synthetic=True))
    if size > 1:
        runs.append(run("1 node", 1, synthetic=False))
    if interruptions_per_hour is not None:
        rate, source = interruptions_per_hour, "given"
    else:
        rate, source = _interruption_rate(record)
    return _analyse(job_name, size, runs, rate, source)


def _check_positive(field: str, value: int) -> None:
    if value < 1:
        raise SpecError(field, f"must be 1 or more, got {value}")


def _derived_name(job: str, tag: str) -> str:
    suffix = f"-dx-{tag}-{uuid.uuid4().hex[:6]}"
    return job[: 63 - len(suffix)].rstrip("-") + suffix


def _run(
    store: Store,
    record: JobRecord,
    name: str,
    label: str,
    count: int,
    synthetic: bool,
    steps: int,
    warmup: int,
    max_seconds: int,
) -> RunMeasurement:
    from trainctl.controller.submit import create_derived_job

    environment = {**record.spec.environment, DIAGNOSE_STEPS: str(steps)}
    environment[DIAGNOSE_WARMUP] = str(warmup)
    if synthetic:
        environment[SYNTHETIC_DATA] = "1"
    updates: dict[str, Any] = {
        "instance_count": count,
        "min_instance_count": None,
        "environment": environment,
        # Its own checkpoints: never resume from, or write into, the job's.
        "checkpoint_s3_uri": None,
        "checkpoint_local_path": None,
        "keep_alive_period_in_seconds": 0,
        "faults": [],
        "max_restarts": 0,
        "max_wait": None,
        "max_run": min(record.spec.max_run, max_seconds),
    }
    derived = create_derived_job(store, record, name, updates)
    final = _follow(store, derived)
    measured = RunMeasurement(
        label=label, job=name, nodes=count, synthetic=synthetic, state=final.state.value
    )
    events = JobStore(store, name).events()
    report = next((e for e in reversed(events) if e.get("type") == "diagnosis"), None)
    if report is not None:
        measured.steps = int(report["steps"])
        measured.ended_early = bool(report.get("ended_early"))
        measured.seconds = float(report["seconds"])
        measured.samples = report.get("samples")
        measured.data_wait = report.get("data_wait")
        measured.saves = int(report.get("saves") or 0)
        measured.checkpoint_stall = report.get("checkpoint_stall")
        measured.checkpoint_write = report.get("checkpoint_write")
    elif final.state is JobState.COMPLETED and final.training_started_at and final.ended_at:
        measured.wall_seconds = parse_iso(final.ended_at) - parse_iso(final.training_started_at)
    else:
        measured.note = f"{final.state.value}: " + (
            final.failure_reason or final.stop_reason or "no measurement"
        )
    return measured


def _follow(store: Store, record: JobRecord) -> JobRecord:
    """Run the derived job to its end, as `fit()` does (its controller here, or remote)."""
    from trainctl.controller.controller import Controller
    from trainctl.controller.submit import start_detached

    if record.spec.controller != "local":
        from trainctl.controller.supervise import supervise

        start_detached(store, record)
        return supervise(store, record.name, printer=None)
    return Controller(store, record.name, printer=None).run()


def _interruption_rate(record: JobRecord) -> tuple[float, str]:
    """Interruptions per instance-hour: the job's own (ended attempts interrupted by the
    provider, over its instance-hours), else the assumed rate of its market."""
    interrupted = 0
    hours = 0.0
    for attempt in record.attempts:
        if attempt.outcome == "interrupted":
            interrupted += 1
        if attempt.ended_at:
            seconds = parse_iso(attempt.ended_at) - parse_iso(attempt.started_at)
            hours += seconds / 3600 * max(1, len(attempt.nodes))
    if interrupted and hours > 0:
        return interrupted / hours, "the job's history"
    if record.spec.use_spot_instances:
        return SPOT_INTERRUPTIONS_PER_HOUR, "assumed for spot capacity"
    return ON_DEMAND_INTERRUPTIONS_PER_HOUR, "assumed for on-demand capacity"


def _analyse(
    job: str, size: int, runs: list[RunMeasurement], rate: float, rate_source: str
) -> Diagnosis:
    main = runs[0]
    synthetic = next((r for r in runs if r.synthetic), None)
    single = next((r for r in runs[1:] if not r.synthetic), None)
    out = Diagnosis(job=job, nodes=size, runs=runs)
    t_main = main.step_seconds

    if t_main is None:
        out.not_measured.append(
            "per-step times: the script sends no steps (call trainctl.train.report_step"
            "(step) on every rank, once per optimizer step), so only whole runs were timed"
        )
    # (a) scaling and communication
    if single is not None:
        t_single = single.step_seconds
        if t_main and t_single:
            per_worker_main, per_worker_single = main.samples_per_step, single.samples_per_step
            work = (
                per_worker_main / per_worker_single
                if per_worker_main and per_worker_single
                else 1.0  # the same per-worker batch, as a DistributedSampler loop has
            )
            compute = t_single * work  # the N-node step's own computation
            out.scaling_efficiency = compute / t_main
            out.communication_share = max(0.0, (t_main - compute) / t_main)
        elif main.wall_seconds and single.wall_seconds:
            # whole runs over the same data: N workers ideally take 1/N of the time
            out.scaling_efficiency = single.wall_seconds / (size * main.wall_seconds)
            out.not_measured.append(
                "communication share: without per-step times only the whole runs compare"
            )
        else:
            out.not_measured.append("scaling: a run did not measure (see its line above)")
    else:
        out.not_measured.append("communication: the job runs on one node (nothing to exchange)")
    # (b) data loading
    if synthetic is not None and t_main and synthetic.step_seconds:
        out.io_share = max(0.0, (t_main - synthetic.step_seconds) / t_main)
    elif main.data_wait is not None and main.seconds:
        out.io_share = main.data_wait / main.seconds
    elif t_main is not None:
        out.not_measured.append(
            "data loading: the script does not draw its batches through "
            "trainctl.train.batches(loader), so no synthetic data could be substituted"
        )
    # (c) checkpoints
    if t_main and main.saves and main.checkpoint_stall is not None and main.seconds:
        out.checkpoint_share = main.checkpoint_stall / main.seconds
        out.checkpoint = _young_daly(main, rate * size, t_main)
        out.interruptions_from = rate_source
    elif t_main is not None:
        out.not_measured.append(
            f"checkpoints: no Checkpointer.save in the {main.steps} measured steps "
            "(the script checkpoints less often: diagnose with more --steps)"
        )
    _conclude(out, size)
    return out


def _young_daly(run: RunMeasurement, rate_per_hour: float, step_seconds: float) -> dict[str, float]:
    """The checkpoint interval that loses least: sqrt(2 * C * MTBF) (Young 1974, Daly 2006),
    C the time a save holds training, MTBF of the whole job (every instance's rate); never
    shorter than one save's background write (one save in flight at a time)."""
    assert run.checkpoint_stall is not None and run.saves
    cost = run.checkpoint_stall / run.saves
    write = (run.checkpoint_write or 0.0) / run.saves
    mtbf = 3600.0 / rate_per_hour
    optimum = max(math.sqrt(2 * cost * mtbf), write, step_seconds)
    return {
        "save_seconds": round(cost, 6),
        "write_seconds": round(write, 6),
        "interruptions_per_hour": rate_per_hour,
        "mtbf_seconds": round(mtbf, 1),
        "optimum_seconds": round(optimum, 3),
        "optimum_steps": float(max(1, round(optimum / step_seconds))),
        "current_steps": round(run.steps / run.saves, 1) if run.steps else 0.0,
    }


def _conclude(out: Diagnosis, size: int) -> None:
    shares = {
        "communication": out.communication_share,
        "data loading": out.io_share,
        "checkpointing": out.checkpoint_share,
    }
    known = {k: v for k, v in shares.items() if v is not None}
    if not known and out.scaling_efficiency is None:
        out.bound = "unknown"
        out.advice.append("nothing could be measured: see below")
        return
    worst = max(known, key=lambda k: known[k]) if known else None
    if worst is not None and known[worst] >= BOUND_SHARE:
        out.bound = worst
    elif known:
        out.bound = "compute"
    if out.bound == "communication":
        out.advice += [
            f"gradient exchange takes {known['communication']:.0%} of a step on {size} nodes: "
            "exchange less often (accumulate k micro-batches under DDP's no_sync())",
            "or give each worker a larger batch (trainctl.train.per_worker_batch, with "
            "scaled_lr and warmup_lr), or run on fewer, larger nodes",
        ]
    elif out.bound == "data loading":
        out.advice += [
            f"waiting for data takes {known['data loading']:.0%} of a step: more DataLoader "
            "workers (num_workers), pin_memory=True and a larger prefetch_factor",
            "or decode and augment once ahead of training, and read from local disk",
        ]
    elif out.bound == "checkpointing":
        out.advice.append(
            f"saving checkpoints holds the loop {known['checkpointing']:.0%} of the time: "
            "use Checkpointer(async_save=True) and the interval below"
        )
    elif out.bound == "compute":
        out.advice.append(
            "the training computation itself bounds throughput: communication, data loading "
            f"and checkpoints each take under {BOUND_SHARE:.0%} of a step"
        )
    if out.checkpoint is not None:
        cp = out.checkpoint
        out.advice.append(
            f"checkpoint every ~{cp['optimum_steps']:.0f} steps ({cp['optimum_seconds']:.0f} s; "
            f"now every {cp['current_steps']:g}): the Young/Daly optimum for a "
            f"{cp['save_seconds'] * 1000:.1f} ms save and one interruption every "
            f"{cp['mtbf_seconds'] / 3600:,.1f} h across the job's nodes ({out.interruptions_from}"
            "; --interruptions-per-hour sets it)"
        )

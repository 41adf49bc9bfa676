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
   script's own checkpoint interval; with the measured save time and the rate of
   interruptions that lose work, the Young/Daly interval sqrt(2 * C * MTBF) is the one that
   loses least. A reclaim whose notice the script checkpoints at (a PreemptionFlag) loses
   nothing whatever the interval, so only failures without a usable notice count.

A script that does not use the helpers still runs (1 and 3, each to its end or to
`max_seconds`): their wall times give the scaling efficiency, and the report says what
could not be measured. Derived jobs never read or write the job's checkpoints (a fresh
checkpoint location each), keep no warm capacity, and inject no faults.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict

from trainctl.errors import SpecError
from trainctl.procs import sigterm_interrupts
from trainctl.record.jobstore import JobStore
from trainctl.record.keys import parse_iso
from trainctl.record.models import JobRecord
from trainctl.state import JobState
from trainctl.store import Store
from trainctl.train.diagnosis import DIAGNOSE_STEPS, DIAGNOSE_WARMUP, SYNTHETIC_DATA
from trainctl.train.interval import (
    FAILURES_PER_NODE_HOUR,
    SPOT_RECLAIMS_PER_NODE_HOUR,
    young_daly_seconds,
)

__all__ = ["Diagnosis", "RunMeasurement", "diagnose"]

# A share of the step time above this bounds throughput (below it, compute does).
BOUND_SHARE = 0.15
# Interruptions per instance-hour assumed when the job's history has none (the controller's
# checkpoint policy assumes the same): spot reclaims; failures without notice.
SPOT_INTERRUPTIONS_PER_HOUR = SPOT_RECLAIMS_PER_NODE_HOUR
ON_DEMAND_INTERRUPTIONS_PER_HOUR = FAILURES_PER_NODE_HOUR
# Repeated runs of one configuration that differ by more than this (max - min, over the
# median): the machine is busy, and the shares are rough.
BUSY_SPREAD = 0.2


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
    # who handles SIGTERM (the notice) in the script: trainctl | script | None (nobody)
    notice_handler: str | None = None
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

    @property
    def timing(self) -> float | None:
        """What repeated runs of its configuration compare: the step time, else the wall."""
        return self.step_seconds or self.wall_seconds

    def line(self) -> str:
        """One line: what this run measured (printed as each run ends)."""
        if self.steps and self.step_seconds:
            rate = f", {self.samples_per_second:,.0f} samples/s" if self.samples_per_second else ""
            what = f"{self.steps} steps, {self.step_seconds * 1000:.1f} ms/step{rate}"
            if self.ended_early:
                what += " (the script ended: fewer steps than asked)"
        elif self.wall_seconds is not None:
            what = f"ran to its end in {self.wall_seconds:.1f} s (no steps reported)"
        else:
            what = self.note or self.state
        return f"{self.label:<28} {what}"


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
    repeats: int = 1  # runs of each configuration
    spread: dict[str, float] = {}  # per configuration: (max - min) / median of its timings
    verdict: str | None = None  # "the machine is busy ..." when repeated runs disagree
    within_noise: list[str] = []  # shares smaller than the runs' own spread
    kept: bool = True  # the measurement runs are still in the store

    def render(self, *, runs: bool = True) -> str:
        """The report; `runs=False` leaves out the runs' lines (the CLI printed each as it
        ended), keeping their job names when they were kept."""
        lines = [f"diagnosis of {self.job} ({self.nodes} node(s))", ""]
        for run in self.runs:
            if runs:
                where = f"   [{run.job}]" if self.kept else ""
                lines.append(f"  {run.line()}{where}")
            elif self.kept:
                lines.append(f"  {run.label:<28} kept as {run.job}")
        for label, spread in self.spread.items():
            lines.append(f"  {label:<28} spread of {self.repeats} runs: {spread:.0%}")
        lines.append("")
        if self.verdict:
            lines += [self.verdict, ""]
        for name, value in (
            ("scaling efficiency", self.scaling_efficiency),
            ("communication share", self.communication_share),
            ("data loading share", self.io_share),
            ("checkpoint share", self.checkpoint_share),
        ):
            if value is not None:
                noise = "  (within noise)" if name.split()[0] in self._noisy() else ""
                lines.append(f"  {name:<20} {value:6.1%}{noise}")
        lines += ["", f"bound by: {self.bound}"]
        lines += [f"  - {text}" for text in self.advice]
        if self.not_measured:
            lines += ["", "not measured:"]
            lines += [f"  - {text}" for text in self.not_measured]
        return "\n".join(lines)

    def _noisy(self) -> set[str]:
        return {name.split()[0] for name in self.within_noise}


def diagnose(
    job_name: str,
    *,
    store: Store | None = None,
    steps: int = 50,
    warmup: int = 5,
    nodes: int | None = None,
    interruptions_per_hour: float | None = None,
    max_seconds: int = 600,
    repeats: int = 3,
    keep: bool = False,
    on_start: Callable[[int], None] | None = None,
    on_run: Callable[[str, str], None] | None = None,
    on_result: Callable[[RunMeasurement], None] | None = None,
) -> Diagnosis:
    """Run `job_name`'s script as bounded derived jobs and say what bounds its throughput.

    `nodes`: the data-parallel size to diagnose (default: the job's instance_count).
    `interruptions_per_hour`: per instance, for the checkpoint interval (default: the job's
    own history of interruptions, else an assumed rate for its market; none for local or
    SSH capacity). `repeats`: runs of each configuration, interleaved, to tell a
    difference from the machine's noise. The measurement runs are hidden from job lists
    and removed at the end unless `keep`. `on_start(nodes)` is told once the input is
    checked, `on_run(label, job)` as each run starts, `on_result(run)` as it ends."""
    from trainctl.store import default_store

    _check_bounds(steps, warmup, max_seconds, repeats, interruptions_per_hour)
    store = store or default_store()
    record = JobStore(store, job_name).load()  # JobNotFoundError: one line, before any run
    size = record.spec.instance_count if nodes is None else nodes
    _check_positive("nodes", size)
    if on_start:
        on_start(size)

    started: list[str] = []  # every run begun, the one under way too

    def run(label: str, count: int, synthetic: bool) -> RunMeasurement:
        tag = "syn" if synthetic else f"{count}n"
        name = _derived_name(job_name, tag)
        started.append(name)
        if on_run:
            on_run(label, name)
        measured = _run(store, record, name, label, count, synthetic, steps, warmup, max_seconds)
        if on_result:
            on_result(measured)
        return measured

    many_label = f"{size} node{'s' if size > 1 else ''}"
    runs: list[RunMeasurement] = []
    try:
        with sigterm_interrupts():
            # Interleaved (a, b, c, a, b, c...): a load that comes and goes touches every
            # configuration alike, rather than all the runs of one.
            for _ in range(repeats):
                runs.append(run(many_label, size, synthetic=False))
                if runs[0].timing is None:
                    break  # no step reported and cut at max_seconds: more runs say no more
                if runs[0].data_wait is not None:  # it draws through `batches`: swap the data
                    runs.append(run(f"{many_label}, synthetic data", size, synthetic=True))
                if size > 1:
                    runs.append(run("1 node", 1, synthetic=False))
    finally:
        _end_runs(store, started)  # (only an interrupted one has not ended)
        if not keep:
            _remove_runs(store, started)
    if interruptions_per_hour is not None:
        rate, source = interruptions_per_hour, "given"
    else:
        rate, source = _interruption_rate(record, _notice_unsaved(runs))
    # An assumed rate is a cloud market's: local and SSH capacity is not reclaimed.
    interruptible = record.spec.provider == "aws" or not source.startswith("assumed")
    steps_in_job = _job_steps(record)
    result = _analyse(
        job_name, size, runs, rate, source, job_steps=steps_in_job, interruptible=interruptible
    )
    result.kept = keep
    return result


def _check_bounds(
    steps: int, warmup: int, max_seconds: int, repeats: int, interruptions_per_hour: float | None
) -> None:
    _check_positive("steps", steps)
    _check_positive("max_seconds", max_seconds)
    _check_positive("repeats", repeats)
    if warmup < 0:
        raise SpecError("warmup", f"must be 0 or more, got {warmup}")
    if interruptions_per_hour is not None and not interruptions_per_hour > 0:
        raise SpecError("interruptions_per_hour", f"must be above 0, got {interruptions_per_hour}")


def _end_runs(store: Store, names: list[str]) -> None:
    """Stop a run diagnose was interrupted in (Ctrl-C, SIGTERM) before its controller
    recorded its end, or before one ran at all: nothing of it goes on."""
    from trainctl.controller.submit import stop_job

    for name in names:
        try:
            if not JobStore(store, name).load().state.is_terminal():
                stop_job(store, name, timeout=60)
        except Exception:  # (not made yet, or gone: nothing to end)
            pass


def _remove_runs(store: Store, names: list[str]) -> None:
    """Remove the runs, each once its controller has let go of it: a run stopped by a
    SIGTERM may still hold its lease for a moment (or until it goes stale, where the
    controller's release did not reach a busy store), and a held lease refuses the removal."""
    from trainctl.controller.lease import lease_is_live
    from trainctl.controller.remove import remove_jobs
    from trainctl.spec.settings import get_settings

    for name in names:
        deadline = time.monotonic() + get_settings().lease_seconds + 5
        try:
            while lease_is_live(JobStore(store, name)) and time.monotonic() < deadline:
                time.sleep(0.25)
            remove_jobs(store, [name])
        except Exception:  # a run that could not be removed is listed by `jobs --all`
            pass


def _job_steps(record: JobRecord) -> int | None:
    """How many steps the job runs, where its own history says (its furthest step)."""
    steps = [a.last_step for a in record.attempts if a.last_step]
    return max(steps) if steps else None


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
    derived = create_derived_job(store, record, name, updates, measurement=True)
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
        measured.notice_handler = report.get("notice_handler")
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
    controller = Controller(store, record.name, printer=None)
    final = controller.run()
    if controller.signalled is not None:  # Ctrl-C or SIGTERM stopped the run: diagnose too
        raise KeyboardInterrupt
    return final


def _notice_unsaved(runs: list[RunMeasurement]) -> str | None:
    """Why a spot reclaim's notice would not save the script's work (None: it would: the
    script checkpoints at it through a PreemptionFlag, within the notice's grace)."""
    from trainctl.spec.settings import get_settings

    measured = [r for r in runs if not r.synthetic and r.steps]
    if not measured:
        return "the script reports no steps, so whether it saves at a notice is unknown"
    run = measured[0]
    if run.notice_handler == "script":
        return (
            "the script handles SIGTERM itself; if it checkpoints there, "
            "--interruptions-per-hour sizes the interval for failures without notice"
        )
    if run.notice_handler != "trainctl":
        return "the script does not save at it (trainctl.train.PreemptionFlag would)"
    grace = get_settings().notice_grace_seconds
    if run.saves:
        per_save = ((run.checkpoint_stall or 0.0) + (run.checkpoint_write or 0.0)) / run.saves
        if per_save >= grace:
            return f"a save takes {per_save:.0f} s, more than the notice's {grace:.0f} s"
    return None


def _interruption_rate(record: JobRecord, notice_unsaved: str | None) -> tuple[float, str]:
    """Interruptions per instance-hour that lose work, and where the figure comes from.

    Only those size the checkpoint interval: a reclaim whose notice the script checkpoints
    at loses nothing whatever the interval (it costs a restart, which no interval changes).
    The job's own history counts its interrupted attempts that lost steps; with no history,
    a market's assumed rate, where spot reclaims count only for a script that does not save
    at their 2-minute notice (failures without notice come on every market)."""
    interrupted = lossy = 0
    hours = 0.0
    for attempt in record.attempts:
        if attempt.outcome == "interrupted":
            interrupted += 1
            lossy += attempt.steps_lost != 0  # None: not reported, so not known to be saved
        hours += attempt.node_hours()
    if lossy and hours > 0:
        return lossy / hours, (
            f"the job's history: {lossy} of its {interrupted} interruption(s) lost work"
        )
    without_notice = "failures without notice assumed as rare as on-demand's"
    if interrupted and hours > 0:
        return ON_DEMAND_INTERRUPTIONS_PER_HOUR, (
            f"the job's history: its {interrupted} interruption(s) were saved at their "
            f"notices; {without_notice}"
        )
    if record.spec.use_spot_instances and notice_unsaved is None:
        return ON_DEMAND_INTERRUPTIONS_PER_HOUR, (
            "assumed: the script checkpoints at a spot reclaim's notice (PreemptionFlag), "
            f"so only {without_notice} count"
        )
    if record.spec.use_spot_instances:
        return SPOT_INTERRUPTIONS_PER_HOUR, (
            f"assumed for spot capacity, every reclaim counted: {notice_unsaved}"
        )
    return ON_DEMAND_INTERRUPTIONS_PER_HOUR, "assumed for on-demand capacity"


def _median_runs(runs: list[RunMeasurement]) -> tuple[dict[str, RunMeasurement], dict[str, float]]:
    """Per configuration (label, in first-run order): its median run, and the spread of its
    runs' timings ((max - min) / median; only where it ran more than once)."""
    by_label: dict[str, list[RunMeasurement]] = {}
    for run in runs:
        by_label.setdefault(run.label, []).append(run)
    medians, spreads = {}, {}
    for label, group in by_label.items():
        timed = sorted((r for r in group if r.timing), key=lambda r: r.timing or 0.0)
        medians[label] = timed[(len(timed) - 1) // 2] if timed else group[0]
        if len(timed) > 1:
            middle = medians[label].timing or 0.0
            spreads[label] = ((timed[-1].timing or 0.0) - (timed[0].timing or 0.0)) / middle
    return medians, spreads


def _scaling(
    out: Diagnosis,
    main: RunMeasurement,
    single: RunMeasurement | None,
    size: int,
    spreads: dict[str, float],
    noise: float,
) -> None:
    """(a) scaling and communication: the N-node run against the one-node run."""
    t_main = main.step_seconds
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
            if spreads and out.communication_share <= noise:
                out.within_noise.append("communication")
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


def _analyse(
    job: str,
    size: int,
    runs: list[RunMeasurement],
    rate: float,
    rate_source: str,
    *,
    job_steps: int | None = None,
    interruptible: bool = True,
) -> Diagnosis:
    medians, spreads = _median_runs(runs)
    chosen = list(medians.values())
    main = chosen[0]
    synthetic = next((r for r in chosen if r.synthetic), None)
    single = next((r for r in chosen[1:] if not r.synthetic), None)
    repeats = max(sum(1 for r in runs if r.label == label) for label in medians)
    out = Diagnosis(job=job, nodes=size, runs=runs, repeats=repeats, spread=spreads)
    noise = max(spreads.values(), default=0.0)  # of a timing, relative
    if spreads and noise > BUSY_SPREAD:
        out.verdict = (
            f"the machine is busy: repeated runs of one configuration differ by up to "
            f"{noise:.0%}, so the shares below are rough (measure again when it is quiet)"
        )
    elif not spreads:
        out.not_measured.append(
            "noise: one run per configuration (--repeats 3 tells a difference from noise)"
        )
    t_main = main.step_seconds

    if t_main is None:
        out.not_measured.append(
            "per-step times: the script sends no steps (call trainctl.train.report_step"
            "(step) on every rank, once per optimizer step), so only whole runs were timed"
        )
    _scaling(out, main, single, size, spreads, noise)  # (a) scaling and communication
    # (b) data loading
    if synthetic is not None and t_main and synthetic.step_seconds:
        out.io_share = max(0.0, (t_main - synthetic.step_seconds) / t_main)
        if spreads and out.io_share <= noise:
            out.within_noise.append("data loading")
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
        if interruptible:
            out.checkpoint = _young_daly(main, rate * size, t_main, job_steps)
            out.interruptions_from = rate_source
        else:
            out.not_measured.append(
                "checkpoint interval: local and SSH capacity is not reclaimed by a provider "
                "(--interruptions-per-hour sizes one for your own failure rate)"
            )
    elif t_main is not None:
        out.not_measured.append(
            f"checkpoints: no Checkpointer.save in the {main.steps} measured steps "
            "(the script checkpoints less often: diagnose with more --steps)"
        )
    _conclude(out, size)
    return out


def _young_daly(
    run: RunMeasurement, rate_per_hour: float, step_seconds: float, job_steps: int | None = None
) -> dict[str, float]:
    """The checkpoint interval that loses least: sqrt(2 * C * MTBF) (Young 1974, Daly 2006),
    C the time a save holds training, MTBF of the whole job (every instance's rate); never
    shorter than one save's background write (one save in flight at a time), and never
    longer than the job (`job_steps`, where known)."""
    assert run.checkpoint_stall is not None and run.saves
    cost = run.checkpoint_stall / run.saves
    write = (run.checkpoint_write or 0.0) / run.saves
    mtbf = 3600.0 / rate_per_hour
    optimum = max(young_daly_seconds(cost, rate_per_hour), write, step_seconds)
    figures = {
        "save_seconds": round(cost, 6),
        "write_seconds": round(write, 6),
        "interruptions_per_hour": rate_per_hour,
        "mtbf_seconds": round(mtbf, 1),
        "optimum_seconds": round(optimum, 3),
        "optimum_steps": float(max(1, round(optimum / step_seconds))),
        "current_steps": round(run.steps / run.saves, 1) if run.steps else 0.0,
    }
    if job_steps and figures["optimum_steps"] >= job_steps:
        figures["job_steps"] = float(job_steps)  # the optimum is past the job's end
    return figures


def _conclude(out: Diagnosis, size: int) -> None:
    shares = {
        "communication": out.communication_share,
        "data loading": out.io_share,
        "checkpointing": out.checkpoint_share,
    }
    known = {k: v for k, v in shares.items() if v is not None and k not in out.within_noise}
    for name in out.within_noise:
        out.advice.append(
            f"the {name} share ({shares[name] or 0:.0%}) is within the spread of repeated "
            "runs: not a difference this machine can measure now"
        )
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
    if out.checkpoint is not None and "job_steps" in out.checkpoint:
        cp = out.checkpoint
        out.advice.append(
            f"no periodic checkpoint is worth its cost: the job's {cp['job_steps']:.0f} steps "
            f"are fewer than the Young/Daly optimum (~{cp['optimum_steps']:.0f}); saving at "
            "interruption notices (PreemptionFlag) and at the end loses least"
        )
    elif out.checkpoint is not None:
        cp = out.checkpoint
        out.advice.append(
            f"checkpoint every ~{cp['optimum_steps']:.0f} steps ({cp['optimum_seconds']:.0f} s; "
            f"now every {cp['current_steps']:g}): the Young/Daly optimum for a "
            f"{cp['save_seconds'] * 1000:.1f} ms save and one interruption that loses work "
            f"every {cp['mtbf_seconds'] / 3600:,.1f} h across the job's nodes "
            f"({out.interruptions_from}"
            "; --interruptions-per-hour sets it)"
        )

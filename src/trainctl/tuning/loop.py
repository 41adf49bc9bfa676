"""A tuning job's supervisor: one process (detached, holding `tuning/<name>/lease.json`)
that asks the search for trials, starts each as an ordinary training job, follows them, stops
the ones the pruner rules out, and ends the tuning job when its budget is spent.

Each trial is recorded before its job is made, and its job name is fixed by its number, so
a supervisor that dies and is replaced (`HyperparameterTuner.attach`, or `wait()` on a tuning
job whose supervisor is gone) neither loses a trial nor runs one twice: a trial recorded
but without a job is started under that same name, and a trial's job that runs on keeps its
own controller (the supervisor only watches it through the store). A trial's job whose
controller is lost - never started because the supervisor before died between making the job
and starting it, or killed since - is given a new one, as `Estimator.attach` would: nothing
else would ever run it, and the tuning job would wait on it forever.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from typing import Any

from trainctl.controller.lease import Lease, LeaseHeld, view_lease
from trainctl.errors import NotFoundError
from trainctl.record.jobstore import JobStore
from trainctl.record.models import JobRecord
from trainctl.spec.settings import get_settings
from trainctl.state import JobState
from trainctl.store import Store
from trainctl.tuning.record import (
    TRIAL_ENDED,
    Trial,
    TuningRecord,
    TuningStore,
    trial_job_name,
)
from trainctl.tuning.search import Intermediates, prune_reason, suggest

POLL_SECONDS = 1.0
# How long a trial's nodes wait, warm, for the next trial (which claims them within a poll or
# two): the bound on idle time if no trial claims them; the tuning job releases what is left.
TRIAL_KEEP_ALIVE_SECONDS = 300


def supervisor_log_path(name: str) -> Any:
    from trainctl.controller.detached import SUPERVISOR_LOG_PREFIX, controller_log_path

    return controller_log_path(SUPERVISOR_LOG_PREFIX + name)


def stray_supervisor_logs(store: Store) -> list[dict[str, str]]:
    """Logs of tuning supervisors whose tuning job has ended but that a process killed
    before its end left on this machine: `trainctl gc --yes` files each in the store
    (tuning/<name>/supervisor.log), as the supervisor does as it ends."""
    from trainctl.controller.detached import SUPERVISOR_LOG_PREFIX, controller_logs
    from trainctl.errors import TrainctlError

    found = []
    for log in controller_logs():
        if not log.stem.startswith(SUPERVISOR_LOG_PREFIX):
            continue
        try:
            tuning = TuningStore(store, log.stem.removeprefix(SUPERVISOR_LOG_PREFIX))
            if tuning.load().state != "InProgress":
                where = {"kind": "supervisor-log", "key": f"{tuning.prefix}/supervisor.log"}
                found.append({**where, "id": str(log), "job": log.stem})
        except (TrainctlError, ValueError):
            continue  # not this store's, or not one gc can judge: it stays
    return found


def spawn_supervisor(store: Store, name: str) -> int:
    """Run the tuning job's supervisor as a detached process of this machine; its pid."""
    from trainctl.controller.detached import spawn_detached

    argv = [sys.executable, "-m", "trainctl.tuning", "--store", store.uri, name]
    return spawn_detached(argv, supervisor_log_path(name), f"tuning-{name}")


def supervisor_alive(store: Store, name: str) -> bool:
    """Whether a live process holds the tuning job's lease."""
    tuning = TuningStore(store, name)
    try:
        lease = json.loads(tuning.store.get_bytes(tuning.lease_key))
    except (NotFoundError, ValueError):
        return False
    return view_lease(lease, get_settings().lease_seconds).live


class Supervisor:
    def __init__(self, store: Store, name: str) -> None:
        self.store = store
        self.tuning = TuningStore(store, name)
        self.name = name
        self.lease = Lease(
            store, self.tuning.lease_key, get_settings().lease_seconds, f"tuning job {name!r}"
        )
        # The curves of trials that have ended: read once, not on every look.
        self._ended_curves: dict[int, dict[int, float]] = {}
        self._lease_s = get_settings().lease_seconds
        self._warm_pools: bool | None = None  # whether the trials' provider keeps warm pools
        # When each trial's job was last given a controller here: a new one takes a moment to
        # hold the job's lease, and is not started twice meanwhile.
        self._controller_started: dict[int, float] = {}

    def run(self) -> TuningRecord:
        """Supervise the tuning job to its end (LeaseHeld if another process does)."""
        self.lease.acquire()
        try:
            before = self.tuning.load()
            # (only the supervisor writes the tuning job's record and events: one writer)
            self.tuning.event(
                "supervisor_started", pid=os.getpid(), host=socket.gethostname(),
                takeover=bool(before.trials),
            )  # fmt: skip
            while True:
                record = self.tuning.load()
                if record.state != "InProgress" or self.lease.lost.is_set():
                    return record
                try:
                    if self.step(record):
                        return record
                except Exception as exc:  # a store hiccup: the next look starts over
                    print(f"[trainctl] tuning job {self.name}: {exc!r}", file=sys.stderr)
                time.sleep(POLL_SECONDS)
        finally:
            self.lease.release()

    def step(self, record: TuningRecord) -> bool:
        """One look at every trial, and new ones where the budget allows; True once the
        tuning job has ended."""
        intermediates = self.intermediates(record)
        for trial in record.running():
            self.follow(record, trial, intermediates)
        if self.tuning.stop_requested():
            for trial in record.running():
                self.end_trial(trial, "Stopped", reason="the tuning job was stopped")
                jobs = JobStore(self.store, trial.job)
                if jobs.exists():  # (a trial recorded but never made has nothing to stop)
                    jobs.request_stop("the tuning job was stopped")
            self.tuning.save(record)
            if self.stopping_jobs(record):
                return False  # they are told; the tuning job ends once they have
            return self.finish(record, "Stopped")
        spec = record.spec
        while len(record.running()) < spec.max_parallel_jobs and len(record.trials) < spec.max_jobs:
            params = suggest(record, intermediates)
            if params is None:  # a Grid with every combination made
                break
            trial = Trial(
                number=len(record.trials), job=trial_job_name(self.name, len(record.trials)),
                params=params,
            )  # fmt: skip
            record.trials.append(trial)
            self.tuning.save(record)  # recorded before its job is made: never lost
            self.start(record, trial)
        self.tuning.save(record)
        if not record.running() and not self.stopping_jobs(record):
            return self.finish(record, "Completed" if record.best() else "Failed")
        return False

    def stopping_jobs(self, record: TuningRecord) -> list[str]:
        """Jobs of trials already ended here that are still winding down: pruned or stopped
        ones stopping, and those whose controller is still handing its nodes to a warm pool.
        The tuning job ends after them, so no trial outlives it and no pool is made after
        the tuning job has released what its trials left. One whose controller is lost is
        given a new one, which carries out the stop it was asked for."""
        out = []
        for trial in record.trials:
            if trial.state not in ("Pruned", "Stopped") and not (
                trial.kept_warm and trial.state in TRIAL_ENDED
            ):
                continue
            jobs = JobStore(self.store, trial.job)
            try:
                job = jobs.load()
                if not job.state.is_terminal():
                    self.restart_lost_controller(trial, jobs, job)
                    out.append(trial.job)
                elif trial.kept_warm and view_lease(jobs.read_lease(), self._lease_s).live:
                    out.append(trial.job)  # (its controller's teardown: keep_warm)
            except NotFoundError:
                continue
        return out

    def keep_alive_for_next(self, record: TuningRecord, trial: Trial) -> int:
        """Seconds the trial's nodes are kept warm for a later trial (0: not): where the
        provider keeps warm pools (EC2), the job sets no keep-alive of its own, and another
        trial starts after this one ends (trial n is followed by trial n + max_parallel_jobs).
        Trials of one tuning job share the capacity spec, so the next one claims the pool."""
        from trainctl.provisioning import get_provider
        from trainctl.provisioning.base import WarmPools

        spec = record.spec
        if spec.job.keep_alive_period_in_seconds or (
            trial.number + spec.max_parallel_jobs >= spec.max_jobs
        ):
            return 0
        if self._warm_pools is None:  # (every trial has the same instance type: asked once)
            provider = get_provider(spec.job.instance_type, spec.job.region)
            self._warm_pools = isinstance(provider, WarmPools)
        return TRIAL_KEEP_ALIVE_SECONDS if self._warm_pools else 0

    def release_warm_pools(self, record: TuningRecord) -> None:
        """End the warm pools the trials left that no trial claimed (their idle time billed
        to the trial that left them). A failure is an event: each pool still halts itself
        when its keep-alive ends."""
        from trainctl.controller.usage import record_idle
        from trainctl.provisioning import get_provider
        from trainctl.spec.request import CapacityRequest

        left = [t.job for t in record.trials if t.kept_warm]
        if not left:
            return
        spec = record.spec.job
        try:
            provider: Any = get_provider(spec.instance_type, spec.region)
            released = provider.release_left_by(CapacityRequest.of(spec), left)
            for job, idle in released:
                record_idle(self.store, job, idle)
        except Exception as exc:
            self.tuning.event("warm_release_failed", error=str(exc))
            return
        if released:
            self.tuning.event("warm_released", jobs=[job for job, _ in released])

    # -- trials ---------------------------------------------------------------------------
    def start(self, record: TuningRecord, trial: Trial) -> None:
        """The trial's training job (its own detached controller), made under its fixed
        name; a job of that name that exists already is this trial's (a takeover)."""
        from trainctl.controller.submit import create_job, start_detached

        jobs = JobStore(self.store, trial.job)
        if not jobs.exists():
            spec = record.spec.job
            update: dict[str, Any] = {
                "job_name": trial.job,
                "hyperparameters": {**spec.hyperparameters, **trial.params},
            }
            if keep := self.keep_alive_for_next(record, trial):
                update["keep_alive_period_in_seconds"] = keep
                trial.kept_warm = True
                self.tuning.save(record)  # before the job: finish() releases what it leaves
            spec = spec.model_copy(update=update)
            try:
                job = create_job(spec, self.store, tuning_job=self.name)
            except Exception as exc:  # e.g. a value the script's spec refuses: that trial fails
                self.end_trial(trial, "Failed", reason=f"could not start: {exc}")
                return
            start_detached(self.store, job)
        trial.state = "Running"
        trial.started_at = trial.started_at or time.time()
        self.tuning.event("trial_started", trial=trial.number, job=trial.job, params=trial.params)

    def follow(self, record: TuningRecord, trial: Trial, intermediates: Intermediates) -> None:
        jobs = JobStore(self.store, trial.job)
        try:
            job = jobs.load()
        except NotFoundError:
            if trial.state == "Pending":
                self.start(record, trial)  # recorded by a supervisor that died before
            return
        if trial.state == "Pending":  # its job was made by a supervisor that died then
            trial.state = "Running"
            trial.started_at = trial.started_at or time.time()
            self.tuning.event("trial_started", trial=trial.number, job=trial.job, adopted=True)
        if job.state.is_terminal():
            self.ended(record, trial, job)
            return
        self.restart_lost_controller(trial, jobs, job)
        if (why := prune_reason(record, trial, intermediates)) is not None:
            # its controller stops it (Stopped, with this reason), its nodes kept warm for
            # the next trial where the trial's are
            jobs.request_stop(why, keep_warm=trial.kept_warm)
            self.end_trial(trial, "Pruned", reason=why)
            trial.objective = last_value(intermediates.get(trial.number))
            self.tuning.event("trial_pruned", trial=trial.number, job=trial.job, why=why)

    def restart_lost_controller(self, trial: Trial, jobs: JobStore, job: JobRecord) -> None:
        """Start a controller for the trial's job if its own is lost (no live lease, or none
        ever and the job older than a lease): the new one takes the job over, adopting the
        nodes that still run, exactly as a user's `attach` does."""
        from trainctl.controller.submit import start_detached
        from trainctl.controller.supervise import controller_view

        view = controller_view(jobs, job)
        if view is None or not view["lost"]:
            return
        last = self._controller_started.get(trial.number)
        if last is not None and time.monotonic() - last < self._lease_s:
            return  # the one started here is still taking the lease
        self._controller_started[trial.number] = time.monotonic()
        self.tuning.event(
            "trial_controller_started", trial=trial.number, job=trial.job,
            silent_seconds=view["silent_seconds"],
        )  # fmt: skip
        start_detached(self.store, job)

    def ended(self, record: TuningRecord, trial: Trial, job: JobRecord) -> None:
        objective = job.metrics.get(record.spec.objective_metric_name)
        if job.state is JobState.COMPLETED and objective is None:
            self.end_trial(
                trial,
                "Failed",
                reason=f"it completed without reporting {record.spec.objective_metric_name}",
            )
        elif job.state is JobState.COMPLETED:
            trial.objective = objective
            self.end_trial(trial, "Completed")
        else:
            state = "Stopped" if job.state is JobState.STOPPED else "Failed"
            self.end_trial(trial, state, reason=job.failure_reason or job.stop_reason)
            trial.objective = objective
        self.tuning.event(
            "trial_ended", trial=trial.number, job=trial.job, state=trial.state,
            objective=trial.objective,
        )  # fmt: skip

    def end_trial(self, trial: Trial, state: Any, *, reason: str | None = None) -> None:
        trial.state = state
        trial.reason = reason
        trial.ended_at = time.time()

    def intermediates(self, record: TuningRecord) -> Intermediates:
        """Each trial's objective values in the order it reported them, numbered from 1
        (its metric history: report_step values, or metric_definitions matches in its log).
        Numbered by report, not by optimizer step, so trials compare at the same point of
        training whatever their batch size: a script that reports once an epoch is
        compared epoch by epoch."""
        out: Intermediates = {}
        if not record.spec.prunes:
            return out
        metric = record.spec.objective_metric_name
        for trial in record.trials:
            if trial.state == "Pending":
                continue
            if trial.number in self._ended_curves:
                out[trial.number] = self._ended_curves[trial.number]
                continue
            try:
                points = JobStore(self.store, trial.job).metric_history()
            except Exception:
                continue
            # a relaunched attempt's redone steps were reported twice: the last word counts
            mine = [p for p in points if p.get("name") == metric and not p.get("redone")]
            out[trial.number] = {n: float(p["value"]) for n, p in enumerate(mine, start=1)}
            if trial.state in TRIAL_ENDED and trial.state != "Pruned":
                self._ended_curves[trial.number] = out[trial.number]  # (a pruned one winds down)
        return out

    def finish(self, record: TuningRecord, state: Any) -> bool:
        self.release_warm_pools(record)
        record.state = state
        record.ended_at = time.time()
        if state == "Failed":
            ended = [t for t in record.trials if t.state in TRIAL_ENDED]
            record.failure_reason = (
                f"no trial completed with {record.spec.objective_metric_name} "
                f"({len(ended)} ended: "
                + ", ".join(sorted({t.state for t in ended}) or {"none"})
                + ")"
            )
        self.tuning.save(record)
        best = record.best()
        self.tuning.event(
            "tuning_ended", state=state, best=best.job if best else None,
            objective=best.objective if best else None,
        )  # fmt: skip
        return True


def last_value(values: dict[int, float] | None) -> float | None:
    if not values:
        return None
    return values[max(values)]


def supervise(store: Store, name: str) -> int:
    """`python -m trainctl.tuning`: 0 once the tuning job has ended; 3 if another process
    supervises it."""
    try:
        Supervisor(store, name).run()
    except LeaseHeld as exc:
        print(f"[trainctl] {exc}", file=sys.stderr, flush=True)
        return 3
    from trainctl.controller.detached import file_log

    try:  # the tuning job has ended: its log into its store prefix, off this machine
        tuning = TuningStore(store, name)
        file_log(store, supervisor_log_path(name), f"{tuning.prefix}/supervisor.log")
    except Exception as exc:  # it stays here: `trainctl gc` finds it
        print(f"[trainctl] the supervisor log stays on this machine: {exc}", flush=True)
    return 0

"""What is shown of tuning jobs: their list and summaries (`trainctl tuning`, the
dashboard), a tuning job's view with its trials' curves, and SageMaker's TuningAnalytics."""

from __future__ import annotations

import math
from typing import Any

from trainctl.errors import NotFoundError
from trainctl.record.models import TO_FIRST_STEP


def trial_job(store: Any, job: str) -> Any:
    """A trial's job record (None: it cannot be read, or is not there yet)."""
    from trainctl.errors import TrainctlError
    from trainctl.record.jobstore import JobStore

    try:
        return JobStore(store, job).load()
    except TrainctlError:
        return None


def trial_start(store: Any, job: str) -> tuple[float | None, bool]:
    """What a trial's start cost: its first attempt's start-up, capacity to the first
    training step (None: not that far yet), and whether it started on warm capacity another
    trial left."""
    record = trial_job(store, job)
    return (None, False) if record is None else start_of(record)


def tuning_goodput(store: Any, record: Any) -> dict[str, Any] | None:
    """A tuning run's goodput: its trials' node-time, where it went (record.goodput)."""
    from trainctl.record.goodput import of_jobs

    jobs = [trial_job(store, t.job) for t in record.trials if t.started_at]
    return of_jobs([j for j in jobs if j is not None])


def start_of(job: Any) -> tuple[float | None, bool]:
    """trial_start's answer from the trial's job record."""
    if not job.attempts:
        return None, False
    first = job.attempts[0]
    total = (first.startup or {}).get(TO_FIRST_STEP)
    return (None if total is None else round(total, 1)), first.warm_pool is not None


class TuningAnalytics:
    """SageMaker's HyperparameterTuningJobAnalytics: every trial, a row each. Given the
    store, each row also says what the trial's start cost (StartSeconds: capacity to its
    first training step) and whether it started on warm capacity (WarmStart)."""

    def __init__(self, record: Any, store: Any = None) -> None:
        self.record = record
        self.store = store

    def rows(self) -> list[dict[str, Any]]:
        out = []
        for trial in self.record.trials:
            elapsed = (
                trial.ended_at - trial.started_at if trial.ended_at and trial.started_at else None
            )
            start: dict[str, Any] = {}
            if self.store is not None:
                seconds, warm = (
                    trial_start(self.store, trial.job) if trial.started_at else (None, False)
                )
                start = {"StartSeconds": seconds, "WarmStart": warm}
            out.append(
                {
                    **trial.params,
                    "TrainingJobName": trial.job,
                    "TrainingJobStatus": trial.state,
                    "FinalObjectiveValue": trial.objective,
                    "TrainingStartTime": trial.started_at,
                    "TrainingEndTime": trial.ended_at,
                    "TrainingElapsedTimeSeconds": elapsed,
                    "Reason": trial.reason,
                    **start,
                }
            )
        return out

    def dataframe(self, force_refresh: bool = False) -> Any:
        """The trials as a pandas DataFrame (SageMaker's columns, a column per tuned
        hyperparameter), best objective first."""
        import pandas as pd

        frame = pd.DataFrame(self.rows())
        if frame.empty:
            return frame
        for column in ("TrainingStartTime", "TrainingEndTime"):
            frame[column] = pd.to_datetime(frame[column], unit="s", utc=True)
        ascending = self.record.spec.objective_type == "Minimize"
        return frame.sort_values("FinalObjectiveValue", ascending=ascending, na_position="last")


def tuning_jobs(store: Any, unreadable: list[tuple[str, str]] | None = None) -> list[Any]:
    """Every tuning job's record in `store`, newest first; those that cannot be read are
    left out, or added to `unreadable` as (name, why) when it is given."""
    from trainctl.errors import TrainctlError
    from trainctl.tuning.record import TuningStore

    records = []
    for name in store.list_dirs("tuning"):
        try:
            records.append(TuningStore(store, name).load())
        except NotFoundError:
            continue  # no record (yet): nothing to list
        except TrainctlError as exc:
            if unreadable is not None:
                unreadable.append((name, str(exc)))
    return sorted(records, key=lambda r: r.created_at, reverse=True)


def tuning_summary(record: Any) -> dict[str, Any]:
    """One line of a tuning job: what `trainctl tuning` lists."""
    best = record.best()
    return {
        "name": record.name,
        "state": record.state,
        "strategy": record.spec.strategy,
        "objective": record.spec.objective_metric_name,
        "max_jobs": record.spec.max_jobs,
        "trials": len(record.trials),
        "best": None if best is None else {"job": best.job, "objective": best.objective},
    }


def tuning_view(record: Any, store: Any) -> dict[str, Any]:
    """A tuning job as the dashboard shows it: its summary, every trial with its values and
    its objective's curve (from the trial job's metric history, redone points left out), the
    best trial's number. Not the job spec: its environment may hold secrets."""
    from trainctl.errors import TrainctlError
    from trainctl.record.jobstore import JobStore

    metric = record.spec.objective_metric_name
    best = record.best()
    trials = []
    for trial in record.trials:
        points: list[dict[str, Any]] = []
        start_s, warm = None, False
        if trial.started_at:
            jobs = JobStore(store, trial.job)
            try:
                job = jobs.load()
                points = jobs.metric_history(job)
                start_s, warm = start_of(job)
            except TrainctlError:  # not made yet, or unreadable: no curve
                pass
        curve = [
            [p["step"] if isinstance(p.get("step"), int) else k, _json_number(p["value"])]
            for k, p in enumerate(q for q in points if q.get("name") == metric)
            if not p.get("redone") and _json_number(p.get("value")) is not None
        ]
        trials.append(
            {
                **trial.model_dump(include={"number", "job", "state", "reason"}),
                "start_seconds": start_s,
                "warm_start": warm,
                "objective": _json_number(trial.objective),
                "params": {k: _json_number(v) for k, v in trial.params.items()},
                "started_at": trial.started_at,
                "ended_at": trial.ended_at,
                "curve": curve,
            }
        )
    return {
        **tuning_summary(record),
        "objective_type": record.spec.objective_type,
        "early_stopping": record.spec.prunes,
        "ranges": list(record.spec.ranges),
        "failure_reason": record.failure_reason,
        "best_trial": None if best is None else best.number,
        "trials": trials,
    }


def _json_number(value: Any) -> Any:
    """A value JSON can carry: NaN and the infinities become None (a diverged trial)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value

"""SageMaker's `sagemaker.tuner` on trainctl: a tuning notebook runs with its imports
changed to `from trainctl.sagemaker.tuner import HyperparameterTuner, ...`; the estimator is
trainctl.sagemaker's (or trainctl's own). See trainctl.tuning for what runs; the tuner here
is trainctl's, whose describe() also answers in DescribeHyperParameterTuningJob's keys."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from trainctl.tuning import (
    CategoricalParameter,
    ContinuousParameter,
    IntegerParameter,
    ParameterRange,
)
from trainctl.tuning import HyperparameterTuner as _Tuner

__all__ = [
    "CategoricalParameter",
    "ContinuousParameter",
    "HyperparameterTuner",
    "IntegerParameter",
    "ParameterRange",
]

# SageMaker's range lists, by trainctl's range kind
RANGE_LISTS = {
    "continuous": "ContinuousParameterRanges",
    "integer": "IntegerParameterRanges",
    "categorical": "CategoricalParameterRanges",
}


# SageMaker's HyperparameterTuner methods with nothing to run here: one line each.
NOT_TUNING = {
    "deploy": "trainctl trains models; it hosts no endpoints (the best job's model is at "
    "best_estimator().model_data)",
    "delete_endpoint": "trainctl hosts no endpoints",
    "transfer_learning_tuner": "no warm start from a parent tuning job",
    "identical_dataset_and_algorithm_tuner": "no warm start from a parent tuning job",
    "create": "no multi-algorithm tuning jobs (one estimator per tuner)",
}


class HyperparameterTuner(_Tuner):
    """trainctl's HyperparameterTuner, describing itself as SageMaker's does."""

    def __init__(self, estimator: Any, *args: Any, **kwargs: Any) -> None:
        from trainctl.sagemaker.train.model_trainer import ModelTrainer

        if isinstance(estimator, ModelTrainer):
            from trainctl.errors import SpecError

            raise SpecError(
                "estimator",
                "a ModelTrainer is tuned by v3's tuner: from trainctl.sagemaker.train.tuner "
                "import HyperparameterTuner; HyperparameterTuner(model_trainer=...)",
            )
        super().__init__(estimator, *args, **kwargs)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), **tuning_job_keys(self._record())}

    def __getattr__(self, name: str) -> Any:
        if name in NOT_TUNING:
            from trainctl.errors import SpecError

            raise SpecError(name, f"not supported by trainctl: {NOT_TUNING[name]}")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


def tuning_job_keys(record: Any) -> dict[str, Any]:
    """DescribeHyperParameterTuningJob's keys for a tuning job's record."""
    spec = record.spec
    counts = {"Completed": 0, "InProgress": 0, "RetryableError": 0, "NonRetryableError": 0}
    counts["Stopped"] = 0
    objectives = {"Succeeded": 0, "Pending": 0, "Failed": 0}
    for trial in record.trials:
        state = {"Pending": "InProgress", "Running": "InProgress", "Failed": "NonRetryableError"}
        counts[state.get(trial.state, "Stopped" if trial.state == "Pruned" else trial.state)] += 1
        if trial.state in ("Pending", "Running"):
            objectives["Pending"] += 1
        elif trial.objective is not None:
            objectives["Succeeded"] += 1
        else:
            objectives["Failed"] += 1
    ranges: dict[str, list[dict[str, Any]]] = {name: [] for name in RANGE_LISTS.values()}
    for name, data in spec.ranges.items():
        entry: dict[str, Any] = {"Name": name}
        if data["kind"] == "categorical":
            entry["Values"] = [str(v) for v in data["values"]]
        else:
            number = int if data["kind"] == "integer" else float
            entry |= {
                "MinValue": str(number(data["min_value"])),
                "MaxValue": str(number(data["max_value"])),
                "ScalingType": data.get("scaling_type", "Auto"),
            }
        ranges[RANGE_LISTS[data["kind"]]].append(entry)
    keys: dict[str, Any] = {
        "HyperParameterTuningJobName": record.name,
        "HyperParameterTuningJobStatus": record.state,
        "HyperParameterTuningJobConfig": {
            "Strategy": spec.strategy,
            "HyperParameterTuningJobObjective": {
                "Type": spec.objective_type,
                "MetricName": spec.objective_metric_name,
            },
            "ResourceLimits": {
                "MaxNumberOfTrainingJobs": spec.max_jobs,
                "MaxParallelTrainingJobs": spec.max_parallel_jobs,
            },
            "ParameterRanges": ranges,
            "TrainingJobEarlyStoppingType": spec.early_stopping_type,
        },
        "TrainingJobStatusCounters": counts,
        "ObjectiveStatusCounters": objectives,
        "CreationTime": _time(record.created_at),
    }
    if record.ended_at is not None:
        keys["HyperParameterTuningEndTime"] = _time(record.ended_at)
    if (best := record.best()) is not None:
        keys["BestTrainingJob"] = {
            "TrainingJobName": best.job,
            "TrainingJobStatus": "Completed",
            "TunedHyperParameters": {k: str(v) for k, v in best.params.items()},
            "FinalHyperParameterTuningJobObjectiveMetric": {
                "MetricName": spec.objective_metric_name,
                "Value": best.objective,
            },
            "TrainingStartTime": _time(best.started_at),
            "TrainingEndTime": _time(best.ended_at),
        }
    if record.failure_reason:
        keys["FailureReason"] = record.failure_reason
    return keys


def _time(epoch: float | None) -> datetime | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, tz=timezone.utc)

"""A training job as SageMaker's SDK shows it: `estimator.latest_training_job` with
`.name`/`.job_name`, and `describe()` with DescribeTrainingJob's keys (TrainingJobStatus,
ModelArtifacts, ...) next to trainctl's own."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from trainctl.estimator import TrainingJob

# trainctl's job state -> (TrainingJobStatus, SecondaryStatus) as SageMaker reports them.
STATUS = {
    "Pending": ("InProgress", "Starting"),
    "Provisioning": ("InProgress", "Starting"),
    "Starting": ("InProgress", "Downloading"),
    "Training": ("InProgress", "Training"),
    "Interrupted": ("InProgress", "Interrupted"),
    "Uploading": ("InProgress", "Uploading"),
    "Completed": ("Completed", "Completed"),
    "Failed": ("Failed", "Failed"),
    "Stopped": ("Stopped", "Stopped"),
}


def _time(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone(timezone.utc)


def sagemaker_keys(info: dict[str, Any], spec: Any) -> dict[str, Any]:
    """DescribeTrainingJob's keys for a job that trainctl's describe() gave as `info`."""
    status, secondary = STATUS.get(info["state"], ("InProgress", info["state"]))
    stop = info.get("stop_reason") or ""
    if status == "Stopped" and stop.startswith(("MaxRuntimeExceeded", "MaxWaitTimeExceeded")):
        secondary = stop.split(":", 1)[0]
    keys: dict[str, Any] = {
        "TrainingJobName": info["name"],
        "TrainingJobStatus": status,
        "SecondaryStatus": secondary,
        # (describe() hid the secret ones)
        "HyperParameters": {k: str(v) for k, v in info["hyperparameters"].items()},
        "ResourceConfig": {
            "InstanceType": spec.instance_type,
            "InstanceCount": spec.instance_count,
            "VolumeSizeInGB": spec.root_volume_gb,
        },
        "StoppingCondition": {"MaxRuntimeInSeconds": spec.max_run}
        | ({"MaxWaitTimeInSeconds": spec.max_wait} if spec.max_wait else {}),
        "EnableManagedSpotTraining": spec.use_spot_instances,
        "CreationTime": _time(info.get("created_at")),
        "TrainingStartTime": _time(info.get("training_started_at")),
        "TrainingEndTime": _time(info.get("ended_at")),
        "FinalMetricDataList": [
            {"MetricName": name, "Value": value} for name, value in info["metrics"].items()
        ],
    }
    if info.get("duration_s") is not None:
        keys["TrainingTimeInSeconds"] = int(info["duration_s"])
    if info.get("model_data"):
        keys["ModelArtifacts"] = {"S3ModelArtifacts": info["model_data"]}
    if info.get("failure_reason"):
        keys["FailureReason"] = info["failure_reason"]
    if spec.checkpoint_s3_uri:
        keys["CheckpointConfig"] = {"S3Uri": spec.checkpoint_s3_uri}
    if spec.output_path:
        keys["OutputDataConfig"] = {"S3OutputPath": spec.output_path}
    return keys


class SageMakerTrainingJob(TrainingJob):
    """SageMaker's `_TrainingJob`: a trainctl job whose describe() also answers in
    DescribeTrainingJob's keys."""

    @property
    def job_name(self) -> str:
        return self.name

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        return {**info, **sagemaker_keys(info, self._record().spec)}

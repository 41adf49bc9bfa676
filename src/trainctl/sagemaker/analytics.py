"""`sagemaker.analytics.TrainingJobAnalytics`: a job's metrics as a pandas DataFrame."""

from __future__ import annotations

from typing import Any

from trainctl.errors import SpecError
from trainctl.estimator import TrainingJob


class TrainingJobAnalytics:
    """SageMaker's `training_job_analytics`: the job's metrics as a pandas DataFrame."""

    def __init__(
        self,
        training_job_name: str | TrainingJob,
        metric_names: list[str] | None = None,
        sagemaker_session: Any = None,
        start_time: Any = None,
        end_time: Any = None,
        period: Any = None,
    ) -> None:
        if isinstance(training_job_name, TrainingJob):
            self.job = training_job_name
        else:
            store = getattr(sagemaker_session, "store", None)
            self.job = TrainingJob.attach(training_job_name, store.uri if store else None)
        self.metric_names = metric_names

    def dataframe(self, force_refresh: bool = False) -> Any:
        """Columns timestamp (seconds since the job started training), metric_name, value."""
        try:
            import pandas as pd
        except ImportError:
            raise SpecError("training_job_analytics", "needs pandas (pip install pandas)") from None
        from trainctl.record.keys import parse_iso

        info = self.job.describe()
        started = info.get("training_started_at") or info.get("created_at")
        zero = parse_iso(started) if started else 0.0
        rows = [
            {"timestamp": p["time"] - zero, "metric_name": p["name"], "value": p["value"]}
            for p in self.job.metric_history(self.metric_names)
            if not p.get("redone")
        ]
        return pd.DataFrame(rows, columns=["timestamp", "metric_name", "value"])

    def export_csv(self, filename: str) -> None:
        self.dataframe().to_csv(filename, index=False)

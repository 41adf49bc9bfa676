"""Hyperparameter tuning, with SageMaker's API: a `HyperparameterTuner` over an Estimator,
its trials ordinary training jobs, the search Optuna's (trainctl.tuning.search), the tuning
job supervised by a detached process that outlives its submitter (trainctl.tuning.loop).

    from trainctl import Estimator
    from trainctl.tuning import HyperparameterTuner, ContinuousParameter, IntegerParameter

    tuner = HyperparameterTuner(
        Estimator("train.py", source_dir="examples/digits", instance_count=2),
        objective_metric_name="test_accuracy",
        hyperparameter_ranges={"lr": ContinuousParameter(0.01, 0.5, "Logarithmic"),
                               "hidden": IntegerParameter(32, 256)},
        max_jobs=12, max_parallel_jobs=3, early_stopping_type="Auto",
    )
    tuner.fit()
    tuner.best_training_job()
"""

from trainctl.tuning.ranges import (
    CategoricalParameter,
    ContinuousParameter,
    IntegerParameter,
    ParameterRange,
)
from trainctl.tuning.tuner import STRATEGIES, HyperparameterTuner, range_from_config
from trainctl.tuning.views import (
    TuningAnalytics,
    trial_start,
    tuning_jobs,
    tuning_summary,
    tuning_view,
)

__all__ = [
    "STRATEGIES",
    "CategoricalParameter",
    "ContinuousParameter",
    "HyperparameterTuner",
    "IntegerParameter",
    "ParameterRange",
    "TuningAnalytics",
    "range_from_config",
    "trial_start",
    "tuning_jobs",
    "tuning_summary",
    "tuning_view",
]

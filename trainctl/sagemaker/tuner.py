"""SageMaker's `sagemaker.tuner` on trainctl: a tuning notebook runs with its imports
changed to `from trainctl.sagemaker.tuner import HyperparameterTuner, ...`; the estimator is
trainctl.sagemaker's (or trainctl's own). See trainctl.tuning for what runs."""

from __future__ import annotations

from trainctl.tuning import (
    CategoricalParameter,
    ContinuousParameter,
    HyperparameterTuner,
    IntegerParameter,
    ParameterRange,
)

__all__ = [
    "CategoricalParameter",
    "ContinuousParameter",
    "HyperparameterTuner",
    "IntegerParameter",
    "ParameterRange",
]

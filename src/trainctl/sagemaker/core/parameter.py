"""`sagemaker.core.parameter` (SDK v3): the hyperparameter ranges a tuner searches,
trainctl.tuning's (the same as v2's `sagemaker.tuner` ranges)."""

from trainctl.tuning.ranges import (
    CategoricalParameter,
    ContinuousParameter,
    IntegerParameter,
    ParameterRange,
)

__all__ = ["CategoricalParameter", "ContinuousParameter", "IntegerParameter", "ParameterRange"]

"""trainctl: managed training for PyTorch.

    from trainctl import Estimator
    est = Estimator(entry_point="train.py", source_dir="examples/digits", instance_count=2,
                    distribution={"torch_distributed": {"enabled": True}})
    job = est.fit()

Heavy modules load on first use so `import trainctl` and `trainctl --help` stay instant.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainctl.version import __version__

TUNING = (
    "HyperparameterTuner",
    "ContinuousParameter",
    "IntegerParameter",
    "CategoricalParameter",
)
__all__ = [
    "Estimator",
    "TrainingJob",
    "JobState",
    "TrainctlError",
    "SpecError",
    "HyperparameterTuner",
    "ContinuousParameter",
    "IntegerParameter",
    "CategoricalParameter",
    "__version__",
]

if TYPE_CHECKING:
    from trainctl.errors import SpecError, TrainctlError
    from trainctl.estimator import Estimator, TrainingJob
    from trainctl.state import JobState
    from trainctl.tuning import (
        CategoricalParameter,
        ContinuousParameter,
        HyperparameterTuner,
        IntegerParameter,
    )


def __getattr__(name: str) -> Any:
    if name in ("Estimator", "TrainingJob"):
        from trainctl import estimator

        return getattr(estimator, name)
    if name in TUNING:
        from trainctl import tuning

        return getattr(tuning, name)
    if name == "JobState":
        from trainctl.state import JobState

        return JobState
    if name in ("TrainctlError", "SpecError"):
        from trainctl import errors

        return getattr(errors, name)
    raise AttributeError(f"module 'trainctl' has no attribute {name!r}")

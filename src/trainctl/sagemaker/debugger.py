"""`sagemaker.debugger`, as far as trainctl runs it: TensorBoard output and torch's profiler.

    from trainctl.sagemaker.debugger import (
        FrameworkProfile, ProfilerConfig, TensorBoardOutputConfig)

    PyTorch(..., tensorboard_output_config=TensorBoardOutputConfig(
                     s3_output_path="s3://bucket/tensorboard",
                     container_local_output_path="/opt/ml/output/tensorboard"),
                 profiler_config=ProfilerConfig(
                     framework_profile_params=FrameworkProfile(start_step=5, num_steps=3)))

What the script writes to container_local_output_path is copied to s3_output_path while the
job runs (`trainctl tensorboard JOB` shows it); FrameworkProfile's steps are profiled with
torch's profiler into the same logs (profiler/). SageMaker Debugger's rules and hooks
(smdebug) and its system monitor are SageMaker's own: their classes exist here so that
imports work, and the estimator refuses them in one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainctl.errors import SpecError


@dataclass
class TensorBoardOutputConfig:
    s3_output_path: str
    container_local_output_path: str | None = None


@dataclass
class FrameworkProfile:
    """The steps torch's profiler covers: `num_steps` after the first `start_step`."""

    local_path: str | None = None
    file_max_size: int | None = None
    file_close_interval: float | None = None
    file_open_fail_threshold: int | None = None
    detailed_profiling_config: Any = None
    dataloader_profiling_config: Any = None
    python_profiling_config: Any = None
    horovod_profiling_config: Any = None
    smdataparallel_profiling_config: Any = None
    start_step: int | None = None
    num_steps: int | None = None
    start_unix_time: int | None = None
    duration: float | None = None


@dataclass
class ProfilerConfig:
    s3_output_path: str | None = None
    system_monitor_interval_millis: int | None = None
    framework_profile_params: FrameworkProfile | None = None
    disable_profiler: bool = False


class DebuggerHookConfig:
    """SageMaker Debugger's tensor hook (smdebug): not run by trainctl."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args, self.kwargs = args, kwargs


class Rule:
    """SageMaker Debugger's rules run in SageMaker's own processing jobs: not here."""

    @classmethod
    def sagemaker(cls, *args: Any, **kwargs: Any) -> Rule:
        return cls()

    @classmethod
    def custom(cls, *args: Any, **kwargs: Any) -> Rule:
        return cls()


class ProfilerRule(Rule):
    pass


class _RuleConfigs:
    """SageMaker's `rule_configs` module (`rule_configs.loss_not_decreasing()`): its
    built-in rules, refused with `rules`."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: name


rule_configs = _RuleConfigs()


def tensorboard_fields(config: Any) -> dict[str, Any]:
    """The job fields of a v2 `tensorboard_output_config` (this TensorBoardOutputConfig or
    one with its attributes)."""
    uri = getattr(config, "s3_output_path", None)
    if not isinstance(uri, str) or not uri:
        raise SpecError(
            "tensorboard_output_config",
            "must be a TensorBoardOutputConfig(s3_output_path=..., "
            "container_local_output_path=...)",
        )
    return {
        "tensorboard_s3_uri": uri,
        "tensorboard_local_path": getattr(config, "container_local_output_path", None),
    }


def profile_of(config: Any, disabled: bool | None) -> str | None:
    """The job's `profile` (START:COUNT) for a v2 `profiler_config`; None: nothing to profile
    (no FrameworkProfile steps, or disable_profiler). System monitoring is SageMaker's own."""
    from trainctl.sagemaker._compat import warn

    if config is None or disabled or getattr(config, "disable_profiler", False):
        return None
    if not isinstance(config, ProfilerConfig):
        raise SpecError("profiler_config", "must be a ProfilerConfig")
    if config.system_monitor_interval_millis is not None or config.s3_output_path is not None:
        warn(
            "profiler_config",
            "system monitoring and its s3_output_path are SageMaker Profiler's: not recorded "
            "(torch's profiler traces go to the TensorBoard logs)",
        )
    framework = config.framework_profile_params
    if framework is None:
        warn("profiler_config", "no framework_profile_params: no steps to profile")
        return None
    if framework.start_unix_time is not None or framework.duration is not None:
        raise SpecError(
            "profiler_config.framework_profile_params",
            "start_unix_time/duration are not supported by trainctl: give start_step and "
            "num_steps (optimizer steps)",
        )
    # SageMaker's defaults for detailed profiling: from step 5, one step
    start = 5 if framework.start_step is None else framework.start_step
    steps = 1 if framework.num_steps is None else framework.num_steps
    return f"{start}:{steps}"

"""Every argument of SageMaker's PyTorch estimator (EstimatorBase, Framework and PyTorch in
the SageMaker Python SDK v2), and what trainctl does with each: passes it on with the same
meaning, accepts it with one warning (nothing to act on here), or refuses it in one line
unless it is left at SageMaker's default. A name SageMaker does not have is a TypeError, as
it would be there, with the closest real name."""

from __future__ import annotations

import difflib
import warnings
from typing import Any

from trainctl.errors import SpecError
from trainctl.spec.fields import sagemaker_passed


class SageMakerCompatibilityWarning(UserWarning):
    """An argument SageMaker accepts that trainctl accepts too but does not act on."""


def warn(name: str, message: str, stacklevel: int = 4) -> None:
    warnings.warn(f"{name}: {message}", SageMakerCompatibilityWarning, stacklevel=stacklevel)


# The signatures of sagemaker.estimator.EstimatorBase, .Framework and
# sagemaker.pytorch.PyTorch (SDK v2, master-v2 of 2026-08): tests/unit/test_sagemaker_shim.py
# checks that each is passed, warned about, refused or named in PyTorch's own signature.
SAGEMAKER_ARGUMENTS = frozenset(
    {
        # EstimatorBase
        "role", "instance_count", "instance_type", "keep_alive_period_in_seconds",
        "volume_size", "volume_kms_key", "max_run", "input_mode", "output_path",
        "output_kms_key", "base_job_name", "sagemaker_session", "tags", "subnets",
        "security_group_ids", "model_uri", "model_channel_name", "metric_definitions",
        "encrypt_inter_container_traffic", "use_spot_instances", "max_wait",
        "checkpoint_s3_uri", "checkpoint_local_path", "rules", "debugger_hook_config",
        "tensorboard_output_config", "enable_sagemaker_metrics", "enable_network_isolation",
        "profiler_config", "disable_profiler", "environment", "max_retry_attempts",
        "source_dir", "git_config", "hyperparameters", "container_log_level", "code_location",
        "entry_point", "dependencies", "instance_groups", "training_repository_access_mode",
        "training_repository_credentials_provider_arn", "enable_infra_check",
        "container_entry_point", "container_arguments", "disable_output_compression",
        "enable_remote_debug", "enable_session_tag_chaining", "training_plan",
        "instance_placement_config",
        # Framework
        "image_uri",
        # PyTorch
        "framework_version", "py_version", "distribution", "compiler_config",
        "training_recipe", "recipe_overrides",
    }
)  # fmt: skip

# Honoured, but not passed as they are: the shim reads them itself.
# model_uri: a channel named model_channel_name (default "model"), as SageMaker's;
# enable_infra_check: every node's GPUs and store are checked before the script starts,
# always (a failed check is a lost node, relaunched elsewhere); git_config: the repository
# is cloned here and source_dir, entry_point and dependencies are read inside it;
# tensorboard_output_config: the TensorBoard location and local dir (sagemaker.debugger);
# profiler_config and disable_profiler: torch's profiler over FrameworkProfile's steps;
# tags: [{"Key", "Value"}] on the job's EC2 instances, volumes and network interfaces.
HANDLED = (
    "input_mode",
    "sagemaker_session",
    "model_uri",
    "model_channel_name",
    "enable_infra_check",
    "git_config",
    "tensorboard_output_config",
    "profiler_config",
    "disable_profiler",
    "tags",
)
# Accepted; one warning when given: trainctl has nothing to do with them.
WARNED = {
    "enable_sagemaker_metrics": "ignored: metrics come from metric_definitions matched in "
    "the node logs",
}
# Refused unless left at SageMaker's default (the values here): each would change how the
# job runs, and trainctl cannot honour it.
REFUSED: dict[str, tuple[tuple[Any, ...], str]] = {
    "rules": ((None,), "no SageMaker Debugger rules"),
    "debugger_hook_config": ((None, False), "no SageMaker Debugger"),
    "enable_network_isolation": ((None, False), "no network isolation"),
    "encrypt_inter_container_traffic": ((None, False), "no encryption between nodes"),
    "instance_groups": ((None,), "no heterogeneous clusters"),
    "training_repository_access_mode": ((None,), "images come from a registry the nodes reach"),
    "training_repository_credentials_provider_arn": ((None,), "no private registry credentials"),
    "enable_remote_debug": ((None, False), "no remote debugging"),
    "compiler_config": ((None,), "no Training Compiler"),
    "training_recipe": ((None,), "no SageMaker HyperPod recipes"),
    "recipe_overrides": ((None,), "no SageMaker HyperPod recipes"),
    "enable_session_tag_chaining": ((None, False), "no session tags"),
    "training_plan": ((None,), "no SageMaker training plans (reserved capacity)"),
    "instance_placement_config": ((None,), "no SageMaker instance placement"),
}
# PyTorch's named parameters (the rest come through **kwargs).
SIGNATURE = (
    "entry_point",
    "framework_version",
    "py_version",
    "source_dir",
    "hyperparameters",
    "image_uri",
    "distribution",
    "role",
    "instance_count",
    "instance_type",
    "base_job_name",
    "dependencies",
)
# Passed on as they are (same name, same meaning): the job fields whose door says so
# (trainctl.spec.fields), less those PyTorch's own signature names.
PASSED = tuple(name for name in sagemaker_passed() if name not in SIGNATURE)
INPUT_MODES = ("File", "FastFile")


# Names people write for SageMaker's own that no spelling distance finds (other SDKs',
# trainctl's): the did-you-mean names SageMaker's.
ALIASES = {
    "env": "environment",
    "environment_variables": "environment",
    "hyperparams": "hyperparameters",
    "spot": "use_spot_instances",
    "use_spot": "use_spot_instances",
    "instances": "instance_count",
    "nodes": "instance_count",
    "checkpoint_path": "checkpoint_local_path",
    "max_runtime": "max_run",
    "job_name": "base_job_name",
}


def tags_of(value: Any) -> dict[str, str]:
    """SageMaker's tags ([{"Key": ..., "Value": ...}], or a dict) as the job's `tags`."""
    if isinstance(value, dict):
        return {str(k): str(v) for k, v in value.items()}
    if not isinstance(value, list | tuple):
        raise SpecError("tags", "must be a list of {'Key': ..., 'Value': ...}")
    out: dict[str, str] = {}
    for i, tag in enumerate(value):
        if not isinstance(tag, dict) or not isinstance(tag.get("Key"), str):
            raise SpecError(f"tags[{i}]", "must be {'Key': ..., 'Value': ...}")
        out[tag["Key"]] = str(tag.get("Value", ""))
    return out


def check_arguments(kwargs: dict[str, Any], owner: str = "PyTorch") -> None:
    """Names SageMaker does not have are a TypeError (with the closest real name); what
    trainctl cannot honour is one line naming it; what it does not act on, one warning."""
    for name in kwargs:
        if name not in SAGEMAKER_ARGUMENTS:
            close = [ALIASES[name]] if name in ALIASES else []
            close = close or difflib.get_close_matches(name, sorted(SAGEMAKER_ARGUMENTS), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise TypeError(f"{owner}() got an unexpected keyword argument {name!r}{hint}")
    for name, (defaults, why) in REFUSED.items():
        if name in kwargs and kwargs[name] not in defaults:
            raise SpecError(name, f"not supported by trainctl: {why}")
    mode = kwargs.get("input_mode", "File")
    if mode not in INPUT_MODES:
        raise SpecError(
            "input_mode",
            f"{mode!r} is not supported by trainctl: File mode (a copy of each channel) or "
            "FastFile (file:// channels linked, not copied); no Pipe mode",
        )
    for name, why in WARNED.items():
        if kwargs.get(name) is not None:
            warn(name, why)

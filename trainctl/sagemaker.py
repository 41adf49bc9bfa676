"""SageMaker's PyTorch estimator, run by trainctl: change one import.

    # from sagemaker.pytorch import PyTorch
    from trainctl.sagemaker import PyTorch, TrainingInput

    est = PyTorch(entry_point="train.py", source_dir="src", role=role,
                  instance_type="ml.p4d.24xlarge", instance_count=2,
                  framework_version="2.5", py_version="py311",
                  distribution={"torch_distributed": {"enabled": True}})
    est.fit({"train": TrainingInput("s3://bucket/train/", distribution="ShardedByS3Key")})
    est.model_data

How SageMaker's arguments map:

- `instance_type`: `ml.<type>` is the EC2 type `<type>`; `local` and `local_gpu` are this
  machine (the local provider). An `ml.` type with no EC2 equivalent is an error.
- `role`: an instance-profile ARN or name is the nodes' instance profile. An IAM role ARN
  gives one warning: trainctl uses the instance profile of the role's name (the one the IAM
  console makes for an EC2 role). Anything else is an error. Unused on `local`.
- `dependencies`: as SageMaker, directories copied next to the source (not pip packages).
- `keep_alive_period_in_seconds`: a warm pool, as SageMaker's (EC2 types only, at most
  3600 s): the next job with the same capacity spec starts on the same instances.
- accepted with one warning, as trainctl has nothing to do with them: `sagemaker_session`,
  `tags`, `code_location`, `container_log_level`, `enable_sagemaker_metrics`,
  `max_retry_attempts` (infrastructure failures are always retried; user failures follow
  `max_restarts`), and `fit(experiment_config=...)`.
- refused in one line naming the argument, unless left at SageMaker's default: what changes
  how the job runs and trainctl cannot honour (KMS keys, network isolation, Pipe mode,
  instance groups, debugger rules, git sources, ...).

Every other argument is SageMaker's, with SageMaker's meaning. An argument SageMaker does not
have is a TypeError, as it would be there.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import warnings
import weakref
from pathlib import Path
from typing import Any

from trainctl.errors import SpecError
from trainctl.estimator import Estimator, TrainingJob
from trainctl.estimator.inputs import TrainingInput

__all__ = ["PyTorch", "TrainingInput", "SageMakerCompatibilityWarning", "TrainingJobAnalytics"]


class SageMakerCompatibilityWarning(UserWarning):
    """An argument SageMaker accepts that trainctl accepts too but does not act on."""


ROLE_ARN_RE = re.compile(
    r"^arn:aws[\w-]*:iam::\d{12}:(?P<kind>role|instance-profile)/(?:[\w+=,.@-]+/)*"
    r"(?P<name>[\w+=,.@-]{1,128})$"
)
PROFILE_NAME_RE = re.compile(r"^[\w+=,.@-]{1,128}$")

# SageMaker arguments passed on as they are (same name, same meaning).
PASSED = (
    "instance_count",
    "volume_size",
    "max_run",
    "output_path",
    "subnets",
    "security_group_ids",
    "metric_definitions",
    "use_spot_instances",
    "max_wait",
    "checkpoint_s3_uri",
    "checkpoint_local_path",
    "environment",
    "keep_alive_period_in_seconds",
)
# Accepted; one warning when given: trainctl has nothing to do with them.
WARNED = {
    "sagemaker_session": "ignored: trainctl keeps jobs in TRAINCTL_STORE and calls AWS with "
    "your own configuration",
    "tags": "not applied: trainctl tags the EC2 resources it makes with trainctl:* tags",
    "code_location": "ignored: the source is packaged into TRAINCTL_STORE",
    "container_log_level": "ignored: the script's own logging configuration applies",
    "enable_sagemaker_metrics": "ignored: metrics come from metric_definitions matched in "
    "the node logs",
    "max_retry_attempts": "ignored: trainctl relaunches after infrastructure failures "
    "without a limit; failures of the script retry up to max_restarts",
    "disable_profiler": "ignored: no profiler runs under trainctl",
}
# Refused unless left at SageMaker's default (the value here): each would change how the
# job runs, and trainctl cannot honour it.
REFUSED = {
    "volume_kms_key": (None, "EBS volumes are encrypted with the account's default key"),
    "output_kms_key": (None, "outputs are written with SSE-S3"),
    "input_mode": ("File", "File mode only (Pipe and FastFile: not yet)"),
    "model_uri": (None, "no model channel: pass the model as an input channel"),
    "model_channel_name": ("model", "no model channel"),
    "rules": (None, "no SageMaker Debugger rules"),
    "debugger_hook_config": (None, "no SageMaker Debugger"),
    "tensorboard_output_config": (None, "TensorBoard output: not yet"),
    "profiler_config": (None, "no SageMaker Profiler"),
    "enable_network_isolation": (False, "no network isolation"),
    "encrypt_inter_container_traffic": (False, "no encryption between nodes"),
    "git_config": (None, "source from git: clone it and give source_dir"),
    "instance_groups": (None, "no heterogeneous clusters"),
    "training_repository_access_mode": (None, "images come from a registry the nodes reach"),
    "training_repository_credentials_provider_arn": (None, "no private registry credentials"),
    "container_entry_point": (None, "the node agent is the entry point"),
    "container_arguments": (None, "the node agent is the entry point"),
    "enable_remote_debug": (None, "no remote debugging"),
    "enable_infra_check": (None, "no infrastructure check"),
    "disable_output_compression": (False, "outputs are always model.tar.gz/output.tar.gz"),
    "compiler_config": (None, "no Training Compiler"),
    "training_recipe": (None, "no SageMaker HyperPod recipes"),
    "recipe_overrides": (None, "no SageMaker HyperPod recipes"),
    "enable_session_tag_chaining": (None, "no session tags"),
    "hyperparameters_to_tune": (None, "no hyperparameter tuning"),
}
REFUSED_DEFAULTS = {"debugger_hook_config": (None, False), "profiler_config": (None,)}
# SageMaker's distribution keys that trainctl runs, and those it cannot.
DISTRIBUTIONS = {"torch_distributed": "torch_distributed", "pytorchddp": "torch_distributed"}


def _warn(name: str, message: str) -> None:
    warnings.warn(f"{name}: {message}", SageMakerCompatibilityWarning, stacklevel=4)


def instance_type_of(value: str) -> str:
    """SageMaker's instance type as trainctl's."""
    from trainctl.spec.catalog import CATALOG

    if value in ("local", "local_gpu"):
        return "local"
    if value.startswith("ml."):
        ec2 = value[len("ml.") :]
        if ec2 not in CATALOG:
            raise SpecError(
                "instance_type",
                f"{value!r} has no EC2 equivalent trainctl can launch (known: "
                f"{', '.join('ml.' + t for t in sorted(CATALOG) if t != 'local')})",
            )
        return ec2
    return value


def instance_profile_of(role: str | None, instance_type: str) -> str | None:
    """The nodes' instance profile from SageMaker's `role` (None on local machines)."""
    if role is None:
        return None
    if not isinstance(role, str):
        raise SpecError("role", "must be an IAM role ARN, an instance profile ARN or name")
    match = ROLE_ARN_RE.fullmatch(role)
    if match is None and not PROFILE_NAME_RE.fullmatch(role):
        raise SpecError(
            "role",
            f"{role!r} is neither an IAM ARN (arn:aws:iam::<account>:role/<name> or "
            ":instance-profile/<name>) nor an instance profile name",
        )
    if instance_type in ("local", "ssh"):
        return None  # machines of your own: their own credentials, no profile
    if match is None or match["kind"] == "instance-profile":
        return role
    _warn(
        "role",
        f"{role} is an IAM role; EC2 nodes run with an instance profile, so trainctl uses "
        f"the instance profile {match['name']!r} (the IAM console makes one of the role's "
        "name for EC2 roles)",
    )
    return match["name"]


def distribution_of(value: dict[str, Any] | None) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise SpecError("distribution", "must be a dict such as {'torch_distributed': {...}}")
    out: dict[str, Any] = {}
    for key, options in value.items():
        if key in DISTRIBUTIONS:
            enabled = bool((options or {}).get("enabled", True))
            out[DISTRIBUTIONS[key]] = {"enabled": enabled}
        elif key == "mpi":
            out["mpi"] = dict(options or {})
        elif key == "smdistributed":
            raise SpecError(
                "distribution",
                "smdistributed (SageMaker's data and model parallel libraries) runs only on "
                "SageMaker; use {'torch_distributed': {'enabled': True}}",
            )
        else:
            raise SpecError(
                "distribution",
                f"{key!r} is not a PyTorch distribution trainctl runs (torch_distributed, "
                "pytorchddp, mpi)",
            )
    return out


class TrainingJobAnalytics:
    """SageMaker's `training_job_analytics`: the job's metrics as a pandas DataFrame."""

    def __init__(self, job: TrainingJob, metric_names: list[str] | None = None) -> None:
        self.job = job
        self.metric_names = metric_names

    def dataframe(self, force_refresh: bool = False) -> Any:
        """Columns timestamp (seconds since the job started training), metric_name, value."""
        try:
            import pandas as pd
        except ImportError:
            raise SpecError("training_job_analytics", "needs pandas (pip install pandas)") from None
        from trainctl.record import parse_iso

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


class PyTorch:
    """`sagemaker.pytorch.PyTorch`, run by trainctl (see the module docstring)."""

    def __init__(
        self,
        entry_point: str,
        framework_version: str | None = None,
        py_version: str | None = None,
        source_dir: str | None = None,
        hyperparameters: dict[str, Any] | None = None,
        image_uri: str | None = None,
        distribution: dict[str, Any] | None = None,
        *,
        role: str | None = None,
        instance_count: int | None = 1,
        instance_type: str | None = None,
        base_job_name: str | None = None,
        dependencies: list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        unknown = sorted(set(kwargs) - set(PASSED) - set(WARNED) - set(REFUSED))
        if unknown:
            raise TypeError(f"PyTorch() got an unexpected keyword argument {unknown[0]!r}")
        for name, (default, why) in REFUSED.items():
            if name in kwargs and kwargs[name] not in REFUSED_DEFAULTS.get(name, (default,)):
                raise SpecError(name, f"not supported by trainctl: {why}")
        for name, why in WARNED.items():
            if kwargs.get(name) is not None:
                _warn(name, why)
        if instance_type is None:
            raise SpecError("instance_type", "is required (e.g. 'ml.p4d.24xlarge' or 'local')")
        itype = instance_type_of(instance_type)
        fields: dict[str, Any] = {k: kwargs[k] for k in PASSED if kwargs.get(k) is not None}
        self._hyperparameters = dict(hyperparameters or {})
        self._sources = _with_dependencies(entry_point, source_dir, dependencies or [])
        if self._sources is not None:
            weakref.finalize(self, shutil.rmtree, self._sources, True)
            if source_dir is None:  # the entry point's directory was copied
                entry_point = Path(entry_point).name
            source_dir = str(self._sources)
        self._fields = {
            **fields,
            "entry_point": entry_point,
            "source_dir": source_dir,
            "framework_version": framework_version,
            "py_version": py_version,
            "image_uri": image_uri,
            "distribution": distribution_of(distribution),
            "instance_type": itype,
            "instance_count": instance_count,
            "instance_profile": instance_profile_of(role, itype),
            "base_job_name": base_job_name,
        }
        self.role = role
        self.instance_type = instance_type
        self.base_job_name = base_job_name
        self._estimator = self._build()  # bad input fails here, at construction

    def _build(self) -> Estimator:
        return Estimator(**self._fields, hyperparameters=dict(self._hyperparameters))

    # -- SageMaker's estimator API ------------------------------------------------------
    def hyperparameters(self) -> dict[str, Any]:
        return dict(self._hyperparameters)

    def set_hyperparameters(self, **kwargs: Any) -> None:
        self._hyperparameters.update(kwargs)
        self._estimator = self._build()

    def fit(
        self,
        inputs: Any = None,
        wait: bool = True,
        logs: bool | str = "All",
        job_name: str | None = None,
        experiment_config: dict[str, Any] | None = None,
    ) -> None:
        """Run the job (SageMaker's fit returns None; the job is `latest_training_job`)."""
        if experiment_config is not None:
            _warn("experiment_config", "ignored: no SageMaker Experiments")
        show = logs not in (False, "None", "Rules")
        self._estimator.fit(inputs, wait=wait, logs=show, job_name=job_name)

    @property
    def latest_training_job(self) -> TrainingJob | None:
        return self._estimator.latest_training_job

    @property
    def model_data(self) -> str | None:
        return self._estimator.model_data

    def logs(self) -> None:
        """Print the latest job's logs, following them until it ends."""
        job = self._require_job("logs")
        job.logs(follow=True)

    @property
    def training_job_analytics(self) -> TrainingJobAnalytics:
        return TrainingJobAnalytics(self._require_job("training_job_analytics"))

    def _require_job(self, what: str) -> TrainingJob:
        if self.latest_training_job is None:
            raise SpecError(what, "no job yet: call fit() first")
        return self.latest_training_job


def _with_dependencies(
    entry_point: str, source_dir: str | None, dependencies: list[str]
) -> Path | None:
    """SageMaker's `dependencies`: directories copied into the code directory, next to the
    source. A temporary copy of source_dir with them, or None when there are none."""
    if not dependencies:
        return None
    source = Path(source_dir) if source_dir else Path(entry_point).resolve().parent
    if not source.is_dir():
        raise SpecError("source_dir", f"{source} is not a directory")
    staged = Path(tempfile.mkdtemp(prefix="trainctl-sagemaker-src-"))
    try:
        shutil.copytree(source, staged, dirs_exist_ok=True, symlinks=True)
        for index, dependency in enumerate(dependencies):
            path = Path(dependency)
            if not path.exists():
                raise SpecError(f"dependencies[{index}]", f"{dependency} does not exist")
            target = staged / path.name
            if path.is_dir():
                shutil.copytree(path, target, dirs_exist_ok=True, symlinks=True)
            else:
                shutil.copy2(path, target)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    return staged

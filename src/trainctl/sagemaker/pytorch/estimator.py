"""`sagemaker.pytorch.PyTorch`, run by trainctl (see trainctl.sagemaker).

How SageMaker's arguments map (every one of them is listed in trainctl.sagemaker._compat):

- `instance_type`: `ml.<type>` is the EC2 type `<type>`; `local` and `local_gpu` are this
  machine (the local provider). An `ml.` type with no EC2 equivalent is an error.
- `role`: an instance-profile ARN or name is the nodes' instance profile. An IAM role ARN
  gives one warning: trainctl uses the instance profile of the role's name (the one the IAM
  console makes for an EC2 role). get_execution_role()'s placeholder (no instance profile
  configured) is fine on this machine and one warning on EC2. Anything else is an error.
- `framework_version`/`py_version`, or an `image_uri` of SageMaker's PyTorch images:
  SageMaker's PyTorch image, built with the trainctl agent added, where it can be had; where
  it cannot (no engine, the engine turned off, a version with no image, no AWS credentials
  for ECR) the job runs as processes with the installed PyTorch, and one warning says why
  (trainctl.sagemaker.images).
- `sagemaker_session`: a trainctl.sagemaker Session is the job's store; `s3://<its default
  bucket>/...` URIs are the store's on a file store (see trainctl.sagemaker.session).
- `input_mode`: File (each channel a copy) or FastFile (file:// channels linked), for every
  channel that does not say otherwise in its TrainingInput.
- `distribution`: torch_distributed and pytorchddp are torchrun; `mpi` is Open MPI;
  `smdistributed`'s dataparallel is torchrun too, its `smddp` backend NCCL on GPUs and gloo
  on CPUs, and `smdistributed.dataparallel` importable on the nodes (a stand-in over
  torch.distributed where SageMaker's own is not installed: trainctl/node/worker_site/
  compat). Its model parallel library is refused in one line.
- `dependencies`: as SageMaker, directories copied next to the source (not pip packages).
- `keep_alive_period_in_seconds`: a warm pool, as SageMaker's (EC2 types only, at most
  3600 s): the next job with the same capacity spec starts on the same instances.
- the rest: passed on with SageMaker's meaning, accepted with one warning when trainctl has
  nothing to act on, or refused in one line unless left at SageMaker's default.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Any

from trainctl.errors import SpecError
from trainctl.estimator import Estimator
from trainctl.estimator.inputs import TrainingInput
from trainctl.sagemaker._compat import PASSED, check_arguments, tags_of, warn
from trainctl.sagemaker.debugger import profile_of, tensorboard_fields
from trainctl.sagemaker.images import (
    FrameworkImage,
    as_processes,
    fit_or_processes,
    framework_image_of,
)
from trainctl.sagemaker.job import SageMakerTrainingJob
from trainctl.sagemaker.session import ROLE_PLACEHOLDER, Session, warn_placeholder_role
from trainctl.spec.uris import as_uri

ROLE_ARN_RE = re.compile(
    r"^arn:aws[\w-]*:iam::\d{12}:(?P<kind>role|instance-profile)/(?:[\w+=,.@-]+/)*"
    r"(?P<name>[\w+=,.@-]{1,128})$"
)
PROFILE_NAME_RE = re.compile(r"^[\w+=,.@-]{1,128}$")
# SageMaker's distribution keys that trainctl runs, and those it cannot.
DISTRIBUTIONS = {"torch_distributed": "torch_distributed", "pytorchddp": "torch_distributed"}
# SageMaker estimator methods for what comes after training (hosting, compiling, ...).
NOT_TRAINING = {
    "deploy": "trainctl trains models; it hosts no endpoints (the model is at model_data)",
    "create_model": "no SageMaker models: the model is at model_data",
    "register": "no SageMaker model registry",
    "transformer": "no batch transform",
    "compile_model": "no SageMaker Neo",
    "delete_endpoint": "trainctl hosts no endpoints",
    "enable_default_profiling": "no SageMaker Profiler",
    "update_profiler": "no SageMaker Profiler",
    "disable_profiling": "no SageMaker Profiler",
}


def instance_type_of(value: str) -> str:
    """SageMaker's instance type as trainctl's."""
    from trainctl.spec.catalog import ec2_name, unknown_type

    if value in ("local", "local_gpu"):
        return value
    if value.startswith("ml.") and ec2_name(value) == value:
        raise SpecError("instance_type", unknown_type(value))
    return ec2_name(value)


def instance_profile_of(role: str | None, instance_type: str) -> str | None:
    """The nodes' instance profile from SageMaker's `role` (None on local machines)."""
    if role is None:
        return None
    if not isinstance(role, str):
        raise SpecError("role", "must be an IAM role ARN, an instance profile ARN or name")
    from trainctl.spec.catalog import CATALOG

    own_machines = instance_type in CATALOG and CATALOG[instance_type].provider != "aws"
    if role == ROLE_PLACEHOLDER:
        if not own_machines:
            warn_placeholder_role()
        return None
    match = ROLE_ARN_RE.fullmatch(role)
    if match is None and not PROFILE_NAME_RE.fullmatch(role):
        raise SpecError(
            "role",
            f"{role!r} is neither an IAM ARN (arn:aws:iam::<account>:role/<name> or "
            ":instance-profile/<name>) nor an instance profile name",
        )
    if own_machines:
        return None  # machines of your own: their own credentials, no profile
    if match is None or match["kind"] == "instance-profile":
        return role
    warn(
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
            out.update(_smdistributed(options))
        else:
            raise SpecError(
                "distribution",
                f"{key!r} is not a PyTorch distribution trainctl runs (torch_distributed, "
                "pytorchddp, mpi)",
            )
    return out


def _smdistributed(options: Any) -> dict[str, Any]:
    """SageMaker's data-parallel library (`{'dataparallel': {'enabled': True}}`) runs as
    torchrun: on the nodes `smdistributed.dataparallel` imports (a stand-in over
    torch.distributed where SageMaker's own is not installed) and the `smddp` backend is
    NCCL on GPUs, gloo on CPUs. The model-parallel library has no such stand-in."""
    parts = options if isinstance(options, dict) else {}
    if (parts.get("modelparallel") or {}).get("enabled"):
        raise SpecError(
            "distribution",
            "smdistributed's model parallel library (SMP) runs only on SageMaker; its "
            "data parallel one runs here: {'smdistributed': {'dataparallel': "
            "{'enabled': True}}}, or torch_distributed with FSDP",
        )
    if not (parts.get("dataparallel") or {}).get("enabled"):
        raise SpecError(
            "distribution",
            "smdistributed without {'dataparallel': {'enabled': True}}: SageMaker's model "
            "parallel library runs only on SageMaker; its data parallel one runs here",
        )
    unknown = sorted(set(parts) - {"dataparallel", "modelparallel"})
    if unknown:
        raise SpecError("distribution", f"smdistributed has no {unknown[0]!r}")
    for option in sorted(set(parts["dataparallel"]) - {"enabled"}):
        warn(
            "distribution",
            f"smdistributed dataparallel's {option!r} tunes SageMaker's own AllReduce; "
            "here the collectives are NCCL's or gloo's, so it has no effect",
        )
    return {
        DISTRIBUTIONS["torch_distributed"]: {"enabled": True},
        "smdistributed": {"dataparallel": {"enabled": True}},
    }


def framework_as_processes(
    framework_version: str | None, py_version: str | None, image_uri: str | None
) -> bool:
    """Whether SageMaker's framework image, named by `framework_version` or by its URI, runs
    as processes with the installed PyTorch here (trainctl.sagemaker.images: one warning)."""
    if image_uri is not None:
        image = framework_image_of(image_uri)
        return image is not None and as_processes(image, "image_uri")
    if framework_version is None:
        return False
    return as_processes(FrameworkImage(framework_version, py_version), "framework_version")


def _on_ec2(instance_type: str) -> bool:
    from trainctl.spec.catalog import CATALOG

    known = CATALOG.get(instance_type)
    return known is not None and known.provider == "aws"


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
        check_arguments(kwargs)
        session = kwargs.get("sagemaker_session")
        if session is not None and not isinstance(session, Session):
            warn("sagemaker_session", "ignored: not a trainctl.sagemaker Session", stacklevel=3)
            session = None
        self.sagemaker_session: Session = session or Session()
        self.input_mode = kwargs.get("input_mode", "File")
        self.model_uri = kwargs.get("model_uri")
        self.model_channel_name = kwargs.get("model_channel_name") or "model"
        if self.model_uri is not None and not isinstance(self.model_uri, str):
            raise SpecError("model_uri", "must be an s3:// or file:// URI (or a local path)")
        if instance_type is None:
            raise SpecError("instance_type", "is required (e.g. 'ml.p4d.24xlarge' or 'local')")
        itype = instance_type_of(instance_type)
        fields = self._passed_fields(kwargs, instance_type, itype)
        # SageMaker's image this job is built on, while it may still turn out not to be had
        self._framework: FrameworkImage | None = None
        if framework_as_processes(framework_version, py_version, image_uri):
            framework_version = py_version = image_uri = None
        elif framework_version is not None and image_uri is None:
            self._framework = FrameworkImage(framework_version, py_version)
        else:
            self._framework = framework_image_of(image_uri)
        self._hyperparameters = dict(hyperparameters or {})
        self._clone = None
        if kwargs.get("git_config") is not None:
            self._clone = clone_git_config(kwargs["git_config"])
            weakref.finalize(self, shutil.rmtree, self._clone, True)
            entry_point, source_dir, dependencies = _in_clone(
                self._clone, entry_point, source_dir, dependencies
            )
        self._sources = _staged_sources(entry_point, source_dir, dependencies or [])
        if self._sources is not None:
            weakref.finalize(self, shutil.rmtree, self._sources, True)
            if source_dir is None:  # the entry point alone was copied
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
            "store_uri": self.sagemaker_session.store.uri,
        }
        self.role = role
        self.instance_type = instance_type
        self.base_job_name = base_job_name
        self._estimator = self._build()  # bad input fails here, at construction

    def _passed_fields(
        self, kwargs: dict[str, Any], instance_type: str, itype: str
    ) -> dict[str, Any]:
        """The job fields SageMaker's keyword arguments give, as trainctl takes them."""
        fields: dict[str, Any] = {k: kwargs[k] for k in PASSED if kwargs.get(k) is not None}
        if "volume_size" in fields and not _on_ec2(itype):
            # SageMaker's local mode ignores it too (the disk is the machine's own).
            warn("volume_size", f"ignored: {instance_type} runs on this machine", stacklevel=4)
            del fields["volume_size"]
        if kwargs.get("tensorboard_output_config") is not None:
            fields.update(tensorboard_fields(kwargs["tensorboard_output_config"]))
        if kwargs.get("tags") is not None:
            fields["tags"] = tags_of(kwargs["tags"])
        profile = profile_of(kwargs.get("profiler_config"), kwargs.get("disable_profiler"))
        if profile is not None:
            fields["profile"] = profile
        for name in ("output_path", "checkpoint_s3_uri", "tensorboard_s3_uri"):
            if name in fields:
                fields[name] = self.sagemaker_session.resolve(fields[name])
        return fields

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
            warn("experiment_config", "ignored: no SageMaker Experiments", stacklevel=3)
        show = logs not in (False, "None", "Rules")
        channels = self._channels(inputs)

        def fit() -> None:
            self._estimator.fit(channels, wait=wait, logs=show, job_name=job_name)

        def without_image() -> None:
            self._fields.update(framework_version=None, py_version=None, image_uri=None)
            self._framework, self._estimator = None, self._build()
            fit()

        field = "image_uri" if self._fields.get("image_uri") else "framework_version"
        fit_or_processes(self._framework, field, fit, without_image)

    def _channels(self, inputs: Any) -> Any:
        """`fit`'s inputs with the session's bucket URIs resolved and the estimator's
        input_mode given to every channel that names none."""
        if inputs is None and self.model_uri is None:
            return None
        if isinstance(inputs, str | TrainingInput):
            inputs = {"training": inputs}
        if inputs is not None and not isinstance(inputs, dict):
            return inputs  # split_inputs names the mistake
        inputs = dict(inputs or {})
        if self.model_uri is not None:  # SageMaker's model channel: another input
            if self.model_channel_name in inputs:
                raise SpecError(
                    "model_channel_name",
                    f"{self.model_channel_name!r} is also a channel of fit()'s inputs",
                )
            inputs[self.model_channel_name] = as_uri(self.model_uri)
        out: dict[str, Any] = {}
        for channel, value in inputs.items():
            if isinstance(value, str):
                value = TrainingInput(value, input_mode=self.input_mode)
            if isinstance(value, TrainingInput):
                value = copy.copy(value)  # the caller's object stays as it was
                value.config = dict(value.config)
                value.s3_data = self.sagemaker_session.resolve(value.s3_data)
                if value.input_mode == "File" and self.input_mode != "File":
                    value.input_mode = self.input_mode
                    value.config["input_mode"] = self.input_mode
            out[channel] = value
        return out

    @property
    def latest_training_job(self) -> SageMakerTrainingJob | None:
        job = self._estimator.latest_training_job
        return None if job is None else SageMakerTrainingJob(job.name, job.store)

    @property
    def model_data(self) -> str | None:
        return self._estimator.model_data

    def logs(self) -> None:
        """Print the latest job's logs, following them until it ends."""
        job = self._require_job("logs")
        job.logs(follow=True)

    @property
    def training_job_analytics(self) -> Any:
        from trainctl.sagemaker.analytics import TrainingJobAnalytics

        return TrainingJobAnalytics(self._require_job("training_job_analytics"))

    def _require_job(self, what: str) -> SageMakerTrainingJob:
        job = self.latest_training_job
        if job is None:
            raise SpecError(what, "no job yet: call fit() first")
        return job

    def __getattr__(self, name: str) -> Any:
        if name in NOT_TRAINING:
            raise SpecError(name, f"not supported by trainctl: {NOT_TRAINING[name]}")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


# git_config's keys (SageMaker's); credentials are refused: a token in a clone URL would
# reach the process list and git's own messages.
GIT_KEYS = {"repo", "branch", "commit"}
GIT_CREDENTIALS = {"2FA_enabled", "username", "password", "token"}


def clone_git_config(config: Any) -> Path:
    """SageMaker's `git_config` ({"repo", "branch", "commit"}): the repository cloned into
    a temporary directory on this machine (the nodes get the packaged source, as always).
    SpecError naming git_config for a bad config or a clone that fails."""
    import subprocess

    if not isinstance(config, dict) or not isinstance(config.get("repo"), str):
        raise SpecError("git_config", "must be a dict with 'repo' (and 'branch', 'commit')")
    if GIT_CREDENTIALS & set(config):
        raise SpecError(
            "git_config",
            "credentials (username, password, token, 2FA_enabled) are not supported: use an "
            "SSH URL with your SSH agent, or a credential helper git already has",
        )
    unknown = sorted(set(config) - GIT_KEYS)
    if unknown:
        raise SpecError("git_config", f"{unknown[0]!r} is not a key; allowed: branch, commit, repo")
    target = Path(tempfile.mkdtemp(prefix="trainctl-sagemaker-git-"))
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}  # a prompt would hang a notebook
    branch = ["--branch", str(config["branch"])] if config.get("branch") else []
    steps = [("clone", ["clone", "--quiet", *branch, config["repo"], str(target)])]
    if config.get("commit"):
        steps.append(
            ("checkout", ["-C", str(target), "checkout", "--quiet", str(config["commit"])])
        )
    for name, args in steps:
        try:
            done = subprocess.run(
                ["git", *args], capture_output=True, text=True, timeout=600, env=env
            )
            why = (done.stderr.strip().splitlines() or ["no output"])[-1]
        except (OSError, subprocess.TimeoutExpired) as exc:
            done, why = None, str(exc)
        if done is None or done.returncode != 0:
            shutil.rmtree(target, ignore_errors=True)
            raise SpecError("git_config", f"git {name} failed: {why}")
    return target


def _in_clone(
    within: Path, entry_point: str, source_dir: str | None, dependencies: list[str] | None
) -> tuple[str, str | None, list[str]]:
    """As on SageMaker with a git_config: source_dir (else entry_point) and dependencies are
    the repository's."""
    if source_dir is not None:
        source_dir = str(_inside(within, source_dir, "source_dir"))
    else:
        entry_point = str(_inside(within, entry_point, "entry_point"))
    deps = [str(_inside(within, d, f"dependencies[{i}]")) for i, d in enumerate(dependencies or [])]
    return entry_point, source_dir, deps


def _inside(root: Path, relative: str, field: str) -> Path:
    """`relative` inside the cloned repository `root` (never outside it)."""
    path = (root / relative).resolve()
    if not path.is_relative_to(root.resolve()):
        raise SpecError(field, f"{relative!r} is outside the git_config repository")
    if not path.exists():
        raise SpecError(field, f"{relative!r} is not in the git_config repository")
    return path


def _staged_sources(
    entry_point: str, source_dir: str | None, dependencies: list[str]
) -> Path | None:
    """The code directory as SageMaker makes it, where it differs from source_dir as given:
    without a source_dir, the entry point alone (not its folder, which in a notebook's
    folder is the notebook and its data), with one warning when the folder has more; and
    `dependencies`, directories copied next to the source. A temporary directory, or None
    when source_dir is the code directory as it is."""
    if source_dir is not None and not dependencies:
        return None
    if source_dir is None:
        script = Path(entry_point)
        if not script.is_file():
            raise SpecError("entry_point", f"{entry_point} is not a file (and no source_dir)")
        others = [p.name for p in script.resolve().parent.iterdir() if p.name != script.name]
        if others:
            warn(
                "source_dir",
                f"not given: only {script.name} is sent to the nodes, as SageMaker does "
                f"(not the {len(others)} other entries of its folder; give source_dir to "
                "send them)",
                stacklevel=5,
            )
    elif not Path(source_dir).is_dir():
        raise SpecError("source_dir", f"{source_dir} is not a directory")
    staged = Path(tempfile.mkdtemp(prefix="trainctl-sagemaker-src-"))
    try:
        if source_dir is None:
            shutil.copy2(entry_point, staged / Path(entry_point).name)
        else:
            shutil.copytree(source_dir, staged, dirs_exist_ok=True, symlinks=True)
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

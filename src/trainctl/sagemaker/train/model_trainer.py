"""`sagemaker.train.ModelTrainer` (SageMaker Python SDK v3; `sagemaker.modules.train` in
2.2xx), run by trainctl: a program written for it runs with its imports changed.

    from trainctl.sagemaker.train import ModelTrainer
    from trainctl.sagemaker.train.configs import SourceCode, Compute, InputData
    from trainctl.sagemaker.train.distributed import Torchrun

    trainer = ModelTrainer(
        source_code=SourceCode(source_dir="src", entry_script="train.py"),
        compute=Compute(instance_type="ml.p4d.24xlarge", instance_count=2),  # or "local"
        distributed=Torchrun(),
        hyperparameters={"epochs": 3},
    )
    trainer.train(input_data_config=[InputData(channel_name="train", data_source="s3://b/t")])
    trainer._latest_training_job.model_artifacts.s3_model_artifacts

It is a face over trainctl's Estimator (one JobSpec, as the v2 PyTorch estimator's): each
field is honoured as SageMaker means it, or refused in one line naming it
(`compute.instance_groups: not supported by trainctl: ...`) unless left at its default.
`Mode.LOCAL_CONTAINER` runs on this machine (the local provider); SAGEMAKER_TRAINING_JOB on
the type `compute.instance_type` names (`ml.` types are EC2's).
"""

from __future__ import annotations

import enum
import json
import shlex
from pathlib import Path
from typing import Any

from trainctl.errors import SpecError
from trainctl.sagemaker._compat import tags_of, warn
from trainctl.sagemaker.images import as_processes, fit_or_processes, framework_image_of
from trainctl.sagemaker.session import ROLE_PLACEHOLDER
from trainctl.sagemaker.train.configs import (
    CheckpointConfig,
    Compute,
    InfraCheckConfig,
    InputData,
    MetricDefinition,
    Networking,
    OutputDataConfig,
    RetryStrategy,
    S3DataSource,
    SourceCode,
    StoppingCondition,
    Tag,
    TensorBoardOutputConfig,
)
from trainctl.sagemaker.train.distributed import MPI, DistributedConfig, Torchrun
from trainctl.sagemaker.train.drivers import CHANNELS, ENTRY_POINT, StagedDriver, stage_driver
from trainctl.spec.uris import as_uri

__all__ = ["Mode", "ModelTrainer"]


class Mode(str, enum.Enum):
    LOCAL_CONTAINER = "LOCAL_CONTAINER"
    SAGEMAKER_TRAINING_JOB = "SAGEMAKER_TRAINING_JOB"


def _refuse(field: str, why: str) -> SpecError:
    return SpecError(field, f"not supported by trainctl: {why}")


class ModelArtifacts:
    """`_latest_training_job.model_artifacts`: where the model went."""

    def __init__(self, uri: str | None) -> None:
        self.s3_model_artifacts = uri


class LatestTrainingJob:
    """`ModelTrainer._latest_training_job`, with SageMaker's names (its TrainingJob
    resource's): `training_job_name`, `training_job_status`, `model_artifacts`,
    `failure_reason`; `job` is trainctl's TrainingJob (logs, metrics, status...)."""

    def __init__(self, job: Any) -> None:
        self.job = job

    @property
    def training_job_name(self) -> str:
        return str(self.job.name)

    @property
    def training_job_status(self) -> str:
        state = self.job.describe()["state"]
        return {"Failed": "Failed", "Stopped": "Stopped", "Completed": "Completed"}.get(
            state, "InProgress"
        )

    @property
    def model_artifacts(self) -> ModelArtifacts:
        return ModelArtifacts(self.job.describe().get("model_data"))

    @property
    def failure_reason(self) -> str | None:
        return self.job.describe().get("failure_reason")

    def wait(self, logs: bool = False) -> None:
        self.job.wait(logs=logs)

    def refresh(self) -> LatestTrainingJob:
        return self


class ModelTrainer:
    """SageMaker's ModelTrainer on trainctl (see the module docstring)."""

    def __init__(
        self,
        *,
        training_mode: Mode | str = Mode.SAGEMAKER_TRAINING_JOB,
        sagemaker_session: Any = None,
        role: str | None = None,
        base_job_name: str | None = None,
        source_code: SourceCode | None = None,
        distributed: Torchrun | MPI | None = None,
        compute: Compute | None = None,
        networking: Networking | None = None,
        stopping_condition: StoppingCondition | None = None,
        training_image: str | None = None,
        training_image_config: Any = None,
        algorithm_name: str | None = None,
        output_data_config: OutputDataConfig | None = None,
        input_data_config: list[InputData] | None = None,
        checkpoint_config: CheckpointConfig | None = None,
        training_input_mode: str | None = "File",
        environment: dict[str, str] | None = None,
        hyperparameters: dict[str, Any] | str | None = None,
        tags: list[Tag] | None = None,
        local_container_root: str | None = None,
    ) -> None:
        from trainctl.sagemaker.session import Session

        try:
            self.training_mode = Mode(training_mode)
        except ValueError:
            allowed = "LOCAL_CONTAINER or SAGEMAKER_TRAINING_JOB"
            raise SpecError("training_mode", f"{training_mode!r} is not {allowed}") from None
        if sagemaker_session is not None and not isinstance(sagemaker_session, Session):
            warn("sagemaker_session", "ignored: not a trainctl.sagemaker Session", stacklevel=3)
            sagemaker_session = None
        self.sagemaker_session = sagemaker_session or Session()
        self.role = role
        self.base_job_name = base_job_name
        self.source_code = source_code
        self.distributed = distributed
        # (SageMaker's default: one ml.m5.xlarge)
        self.compute = compute or Compute(instance_type="ml.m5.xlarge", instance_count=1)
        self.networking = networking
        self.stopping_condition = stopping_condition
        self.training_image = training_image
        self.output_data_config = output_data_config
        self.input_data_config = list(input_data_config or [])
        self.checkpoint_config = checkpoint_config
        self.training_input_mode = training_input_mode or "File"
        self.environment = dict(environment or {})
        self.hyperparameters = _hyperparameters(hyperparameters)
        self.tags = tags
        self.metric_definitions: list[MetricDefinition] = []
        self.retry_strategy: RetryStrategy | None = None
        self.tensorboard_output_config: TensorBoardOutputConfig | None = None
        self._latest_training_job: LatestTrainingJob | None = None
        for name, value, why in (
            ("training_image_config", training_image_config, "private registries' own auth"),
            ("algorithm_name", algorithm_name, "SageMaker's built-in algorithms run only there"),
        ):
            if value is not None:
                raise _refuse(name, why)
        if local_container_root is not None:
            warn("local_container_root", "ignored: a job's files are in trainctl's store")
        # SageMaker's own PyTorch image, where it cannot be had: the installed PyTorch (once)
        framework = framework_image_of(training_image)
        self._image_as_processes = framework is not None and as_processes(
            framework, "training_image"
        )
        self._estimator()  # bad input fails here, at construction, as SageMaker's does

    # -- SageMaker's builders ------------------------------------------------------------
    def with_checkpoint_config(self, checkpoint_config: CheckpointConfig | None = None):
        self.checkpoint_config = checkpoint_config or CheckpointConfig()
        self._estimator()
        return self

    def with_metric_definitions(self, metric_definitions: list[MetricDefinition]):
        self.metric_definitions = list(metric_definitions)
        self._estimator()
        return self

    def with_retry_strategy(self, retry_strategy: RetryStrategy):
        self.retry_strategy = retry_strategy
        self._estimator()
        return self

    def with_infra_check_config(self, infra_check_config: InfraCheckConfig | None = None):
        # trainctl checks every node's GPUs (and its store) before the script starts, always
        return self

    def with_tensorboard_output_config(
        self, tensorboard_output_config: TensorBoardOutputConfig | None = None
    ):
        self.tensorboard_output_config = tensorboard_output_config or TensorBoardOutputConfig()
        self._estimator()
        return self

    def __getattr__(self, name: str) -> Any:
        not_here = {
            "with_remote_debug_config": "no remote debugging of SageMaker's containers",
            "with_session_chaining_config": "no session chaining",
            "from_recipe": "HyperPod recipes run only on SageMaker",
            "from_jumpstart_config": "JumpStart models run only on SageMaker",
            "create_input_data_channel": "channels are InputData here, given to train()",
        }
        if name in not_here:
            raise _refuse(name, not_here[name])
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # -- running -------------------------------------------------------------------------
    def train(
        self,
        input_data_config: list[InputData] | None = None,
        wait: bool = True,
        logs: bool = True,
    ) -> None:
        """Run the job (SageMaker's train returns None; the job is `_latest_training_job`)."""
        if input_data_config is not None:
            self.input_data_config = list(input_data_config)
        inputs = self._inputs() or None

        def fit() -> Any:
            return self._estimator(to_run=True).fit(inputs, wait=wait, logs=logs)

        def without_image() -> Any:
            self._image_as_processes = True
            return fit()

        framework = None if self._image_as_processes else framework_image_of(self.training_image)
        job = fit_or_processes(framework, "training_image", fit, without_image)
        self._latest_training_job = LatestTrainingJob(job)

    def _inputs(self) -> dict[str, Any]:
        from trainctl.estimator.inputs import TrainingInput

        mode = self.training_input_mode
        if mode not in ("File", "FastFile"):
            raise _refuse("training_input_mode", f"{mode!r}: File or FastFile (no Pipe mode)")
        channels: dict[str, Any] = {}
        for index, data in enumerate(self.input_data_config):
            if not isinstance(data, InputData):
                raise SpecError(f"input_data_config[{index}]", "must be an InputData")
            source = data.data_source
            distribution = None
            if isinstance(source, S3DataSource):
                distribution = source.s3_data_distribution_type
                source = source.s3_uri
            elif not isinstance(source, str):
                raise _refuse(
                    f"input_data_config[{index}].data_source",
                    "no EFS or FSx file systems: an s3:// or file:// URI, or a local path",
                )
            uri = self.sagemaker_session.resolve(as_uri(source))
            channels[data.channel_name] = TrainingInput(
                uri, distribution=distribution, input_mode=mode, content_type=data.content_type
            )
        if isinstance(self.distributed, DistributedConfig) and self.distributed.driver_script:
            driver = self._driver()
            for name, folder in zip(CHANNELS, (driver.code, driver.drivers), strict=True):
                if name in channels:
                    raise SpecError(
                        f"input_data_config.{name}",
                        "is the source code's or the driver's channel with a driver of your own",
                    )
                channels[name] = TrainingInput(as_uri(str(folder)))
        return channels

    def _driver(self) -> StagedDriver:
        """The distributed driver of the user's own, staged once (see trainctl.sagemaker.
        train.drivers)."""
        if getattr(self, "_staged_driver", None) is None:
            code = self.source_code
            if code is None or not code.source_dir or not code.entry_script:
                raise SpecError(
                    "source_code", "a driver of your own needs source_dir and entry_script"
                )
            self._staged_driver = stage_driver(
                self, self.distributed, code.source_dir, code.entry_script
            )
        return self._staged_driver

    def _estimator(self, *, to_run: bool = False) -> Any:
        """The trainctl Estimator of the trainer as it is now (bad input: SpecError);
        `to_run`: the one a job runs now (see _compute_fields)."""
        from trainctl.estimator import Estimator
        from trainctl.sagemaker.pytorch.estimator import (
            distribution_of,
            instance_profile_of,
        )

        fields: dict[str, Any] = {**self._source_fields(), **self._compute_fields(to_run)}
        itype = fields["instance_type"]
        # (get_execution_role()'s placeholder is no EC2 role to warn about where the job
        # runs on this machine: see _compute_fields)
        placeholder = self.role == ROLE_PLACEHOLDER and self._here_instead(itype, say=False)
        fields["instance_profile"] = None if placeholder else instance_profile_of(self.role, itype)
        fields.update(self._stopping_fields())
        fields.update(self._output_fields())
        if self.networking is not None:
            _refuse_set(self.networking, {"security_group_ids", "subnets"}, "networking")
            fields["security_group_ids"] = self.networking.security_group_ids or []
            fields["subnets"] = self.networking.subnets or []
        if isinstance(self.distributed, Torchrun):
            if self.distributed.smp is not None:
                raise _refuse(
                    "distributed.smp", "SageMaker's model parallel library runs only on SageMaker"
                )
            fields["distribution"] = distribution_of({"torch_distributed": {"enabled": True}})
            fields["processes_per_host"] = self.distributed.process_count_per_node
        elif isinstance(self.distributed, MPI):
            fields["distribution"] = distribution_of({"mpi": self.distributed.options()})
        elif isinstance(self.distributed, DistributedConfig) and self.distributed.driver_script:
            driver = self._driver()
            fields.update(source_dir=str(driver.source_dir), entry_point=ENTRY_POINT)
        elif self.distributed is not None:
            raise SpecError(
                "distributed", "must be a Torchrun, an MPI or a DistributedConfig with a driver"
            )
        if self.training_image is not None and not self._image_as_processes:
            fields["image_uri"] = self.training_image
        if self.metric_definitions:
            fields["metric_definitions"] = [
                {"Name": m.name, "Regex": m.regex} for m in self.metric_definitions
            ]
        if self.tensorboard_output_config is not None:
            tensorboard = self.tensorboard_output_config
            if tensorboard.s3_output_path:
                uri = as_uri(tensorboard.s3_output_path)
                fields["tensorboard_s3_uri"] = self.sagemaker_session.resolve(uri)
            fields["tensorboard_local_path"] = tensorboard.local_path
        if self.tags:
            fields["tags"] = tags_of([{"Key": t.key, "Value": t.value} for t in self.tags])
        if self.retry_strategy is not None:
            fields["max_retry_attempts"] = self.retry_strategy.maximum_retry_attempts
        fields = {k: v for k, v in fields.items() if v is not None}
        return Estimator(
            **fields,
            hyperparameter_style="json",  # (v3's drivers: --flag true, not True)
            base_job_name=self.base_job_name,
            store_uri=self.sagemaker_session.store.uri,
            environment=self.environment,
            hyperparameters=self.hyperparameters,
        )

    def _source_fields(self) -> dict[str, Any]:
        code = self.source_code
        if code is None:
            raise SpecError("source_code", "is required here: SourceCode(source_dir=..., "
                            "entry_script=...) (no training_image of its own to run)")  # fmt: skip
        fields: dict[str, Any] = {"source_dir": code.source_dir}
        if code.entry_script and code.command:
            raise SpecError("source_code", "give entry_script or command, not both")
        if code.command:
            words = shlex.split(code.command)
            if len(words) < 2 or Path(words[0]).name not in ("python", "python3"):
                raise _refuse(
                    "source_code.command",
                    f"{code.command!r}: only `python SCRIPT [ARG ...]` (or use entry_script)",
                )
            fields["entry_point"], fields["arguments"] = words[1], words[2:]
        elif code.entry_script:
            fields["entry_point"] = code.entry_script
        else:
            raise SpecError("source_code", "needs entry_script (or command)")
        if code.requirements not in (None, "requirements.txt"):
            raise _refuse(
                "source_code.requirements",
                f"{code.requirements!r}: the nodes install source_dir's requirements.txt",
            )
        if code.ignore_patterns:
            warn("source_code.ignore_patterns", "ignored: source_dir's .trainctlignore says")
        return fields

    def _compute_fields(self, to_run: bool = False) -> dict[str, Any]:
        """The job's capacity. An EC2 type that a job is run with (`to_run`) on a file
        store, which no EC2 node reaches, runs on this machine instead, with one warning:
        SageMaker's examples name an `ml.` type without a local mode of their own."""
        from trainctl.sagemaker.pytorch.estimator import instance_type_of

        compute = self.compute
        for name, why in (
            ("instance_groups", "no heterogeneous clusters"),
            ("training_plan_arn", "no SageMaker training plans"),
        ):
            if getattr(compute, name):
                raise _refuse(f"compute.{name}", why)
        if self.training_mode is Mode.LOCAL_CONTAINER:
            itype = "local_gpu" if compute.instance_type == "local_gpu" else "local"
        elif compute.instance_type is None:
            raise SpecError("compute.instance_type", "is required (e.g. 'ml.p4d.24xlarge')")
        else:
            itype = instance_type_of(compute.instance_type)
            if to_run and self._here_instead(itype, say=True):
                itype = "local"
        fields: dict[str, Any] = {
            "instance_type": itype,
            "instance_count": compute.instance_count or 1,
            "use_spot_instances": bool(compute.enable_managed_spot_training),
            "keep_alive_period_in_seconds": compute.keep_alive_period_in_seconds,
            "volume_kms_key": compute.volume_kms_key_id,
        }
        if itype not in ("local", "local_gpu") and compute.volume_size_in_gb not in (None, 30):
            fields["volume_size"] = compute.volume_size_in_gb
        return fields

    def _here_instead(self, itype: str, *, say: bool) -> bool:
        from trainctl.spec.catalog import CATALOG

        known = CATALOG.get(itype)
        if known is None or known.provider != "aws" or not self.sagemaker_session.local_store:
            return False
        store = self.sagemaker_session.store.uri
        if say:
            warn(
                "compute.instance_type",
                f"{self.compute.instance_type} runs on this machine: trainctl's store ({store}) "
                "is not reachable from EC2; set TRAINCTL_STORE=s3://BUCKET/PREFIX to run on EC2",
                stacklevel=5,
            )
        return True

    def _stopping_fields(self) -> dict[str, Any]:
        stop = self.stopping_condition
        if stop is None:
            return {}
        if stop.max_pending_time_in_seconds is not None:
            warn(
                "stopping_condition.max_pending_time_in_seconds",
                "accepted: max_wait_time_in_seconds bounds the wait for capacity here",
            )
        return {"max_run": stop.max_runtime_in_seconds, "max_wait": stop.max_wait_time_in_seconds}

    def _output_fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {}
        out = self.output_data_config
        if out is not None:
            if out.kms_key_id:
                fields["output_kms_key"] = out.kms_key_id
            compression = (out.compression_type or "GZIP").upper()
            if compression not in ("GZIP", "NONE"):
                raise SpecError("output_data_config.compression_type", "must be GZIP or NONE")
            fields["disable_output_compression"] = compression == "NONE"
            if out.s3_output_path:
                fields["output_path"] = self.sagemaker_session.resolve(out.s3_output_path)
        ckpt = self.checkpoint_config
        if ckpt is not None:
            if ckpt.s3_uri:
                fields["checkpoint_s3_uri"] = self.sagemaker_session.resolve(ckpt.s3_uri)
            if ckpt.local_path and ckpt.local_path != "/opt/ml/checkpoints":
                fields["checkpoint_local_path"] = ckpt.local_path
        return fields


def _refuse_set(config: Any, allowed: set[str], owner: str) -> None:
    """A field of `config` outside `allowed` that is set: refused in one line."""
    for name, value in config.model_dump().items():
        if name not in allowed and value:
            raise _refuse(f"{owner}.{name}", "trainctl's nodes reach each other and the store")


def _hyperparameters(value: dict[str, Any] | str | None) -> dict[str, Any]:
    """A dict, or (as SageMaker's v3) the path of a JSON or YAML file holding one."""
    if value is None:
        return {}
    if isinstance(value, dict):
        return dict(value)
    if not isinstance(value, str):
        raise SpecError("hyperparameters", "must be a dict or the path of a JSON or YAML file")
    path = Path(value)
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError("hyperparameters", f"cannot read {value}: {exc.strerror}") from None
    try:
        loaded = json.loads(text)
    except ValueError:
        import yaml

        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError:
            loaded = None
    if not isinstance(loaded, dict):
        raise SpecError("hyperparameters", f"{value} holds no JSON or YAML mapping")
    return loaded

"""The job specification: every field a user can give, validated before anything runs.

The Estimator, `trainctl submit` flags and `-f job.yaml` all end up here, so one set of rules
(and one wording of each error) serves every entry point.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from trainctl.errors import SpecError
from trainctl.spec.capacity import (
    POOL_NAME_RE,
    ImageId,
    KmsKeyId,
    Region,
    SecurityGroupIds,
    SshHost,
    SubnetIds,
)
from trainctl.spec.checks import (
    ENV_NAME_RE,
    IMAGE_URI_RE,
    JOB_NAME_RE,
    MAX_KEEP_ALIVE_SECONDS,
    RECORDED,
    ChannelName,
    InputUri,
    _check_channel_envs,
    _check_uri,
    check_across_fields,
    check_arguments,
    check_hyperparameters,
    check_tags,
    check_workdir_ignore,
    profile_steps,
)
from trainctl.spec.door import Door
from trainctl.spec.limits import (
    DEFAULT_VOLUME_GB,
    MAX_INSTANCE_COUNT,
    check_environment,
    system_path,
)
from trainctl.spec.options import AwsOptions, SshOptions
from trainctl.spec.parts import (
    ChannelConfig,
    Distribution,
    Fault,
    MetricDefinition,
    StrictModel,
)


class JobSpec(StrictModel):
    """Everything needed to run a job; stored as `spec` in the job's job.json."""

    entry_point: Annotated[
        str,
        Door(
            "The training script, relative to source_dir.",
            cli="argument",
            estimator=False,
            sagemaker="same",
        ),
    ]
    source_dir: Annotated[
        str,
        Door(
            "The code directory (default: the entry point's); packaged and sent to every node.",
            estimator=False,
            sagemaker="same",
        ),
    ]  # absolute, resolved
    # The name SageMaker Processing uses.
    arguments: Annotated[
        list[str],
        Door(
            "The script's own positional arguments, before the hyperparameters' --key value pairs "
            "(on the command line: after `--`).",
            cli="argument",
        ),
    ] = Field(default_factory=list)
    # SageMaker's container_entry_point/container_arguments: a command in place of
    # `python entry_point` (trainctl.launcher.plain), once per node.
    container_entry_point: Annotated[
        list[str],
        Door(
            "A command each node runs in place of `python entry_point`, in the code directory "
            "with the SM_* environment (e.g. bash run.sh); no distribution; repeatable, a word "
            "each.",
            cli="repeated",
            metavar="WORD",
            sagemaker="same",
        ),
    ] = Field(default_factory=list, max_length=256)
    container_arguments: Annotated[
        list[str],
        Door(
            "Arguments after container_entry_point; repeatable.",
            cli="repeated",
            metavar="ARG",
            sagemaker="same",
        ),
    ] = Field(default_factory=list, max_length=4096)
    instance_type: Annotated[
        str,
        Door(
            "'local' (this machine, the default; its GPUs shared among the nodes), "
            "'local_gpu' (the same, refused without a GPU), 'ssh' (hosts), an EC2 type "
            "(ml. names too), or a plug-in's ('slurm': an allocation of a Slurm cluster).",
            sagemaker="mapped: ml.<type> is the EC2 type; local and local_gpu are the same",
        ),
    ] = "local"
    # strict: True is not a count, and "2" from an untyped source is a mistake worth naming
    instance_count: Annotated[int, Door("Nodes.", sagemaker="same")] = Field(
        default=1, ge=1, le=MAX_INSTANCE_COUNT, strict=True
    )
    processes_per_host: Annotated[
        int | None, Door("Worker processes per node (default: its GPUs, or 1).")
    ] = Field(default=None, ge=1, le=64, strict=True)
    hyperparameters: Annotated[
        dict[str, Any],
        Door(
            "KEY=VALUE passed to the script as --KEY VALUE (JSON values: 8, 0.1, true).",
            cli="typed",
            short="-p",
            old_flags=("--hyperparameter",),
            metavar="KEY=VALUE",
            sagemaker="same",
        ),
    ] = Field(default_factory=dict)
    hyperparameter_style: Annotated[
        Literal["python", "json"],
        Door(
            "How --KEY VALUE spells a value that is not a string: python (True; SageMaker "
            "v2's training toolkit) or json (true; SageMaker v3's ModelTrainer). Lists and "
            "mappings are JSON either way.",
            sagemaker="mapped: ModelTrainer's jobs are json",
        ),
    ] = "python"
    distribution: Annotated[
        Distribution | None,
        Door(
            "The launcher: torch_distributed (torchrun), mpi, or none (one python per node).",
            cli="own",
            metavar="torch_distributed|mpi|none",
            sagemaker="mapped: torch_distributed, pytorchddp and mpi",
        ),
    ] = None
    environment: Annotated[
        dict[str, str],
        Door(
            "NAME=VALUE in the script's environment.",
            cli="pairs",
            short="-e",
            old_flags=("--env",),
            metavar="NAME=VALUE",
            sagemaker="same",
        ),
    ] = Field(default_factory=dict)
    inputs: Annotated[
        dict[ChannelName, InputUri],
        Door(
            "CHANNEL=URI: a data channel (file:// or s3://), at `SM_CHANNEL_<CHANNEL>` on every "
            "node.",
            cli="pairs",
            old_flags=("--input",),
            metavar="CHANNEL=URI",
            sagemaker="mapped: fit()'s inputs",
        ),
    ] = Field(default_factory=dict)
    # Per channel: its distribution (FullyReplicated | ShardedByS3Key) and content type.
    channel_config: Annotated[
        dict[ChannelName, ChannelConfig],
        Door(
            "CHANNEL=JSON: a channel's options as a JSON object: distribution (FullyReplicated "
            "or ShardedByS3Key), input_mode (File or FastFile), content_type.",
            cli="typed",
            metavar="CHANNEL=JSON",
            sagemaker="mapped: fit()'s TrainingInput options",
        ),
    ] = Field(default_factory=dict)
    output_path: Annotated[
        str | None,
        Door(
            "Where model.tar.gz and output.tar.gz go (default: the job's store prefix).",
            sagemaker="same",
        ),
    ] = None
    container_log_level: Annotated[
        int,
        Door(
            "The logging level the job's SageMaker-style scripts are given (SM_LOG_LEVEL, the "
            "training toolkit's log_level; logging.INFO: 20).",
            sagemaker="same",
        ),
    ] = Field(default=20, ge=0, le=50, strict=True)
    output_kms_key: Annotated[
        KmsKeyId,
        Door(
            "The KMS key (id, alias/NAME or ARN) that encrypts the model and output data in "
            "S3 (default: S3's own keys; a file:// output is the disk's).",
            sagemaker="same",
        ),
    ] = None
    code_location: Annotated[
        str | None,
        Door(
            "Where the packaged source goes: <URI>/<job>/source/sourcedir.tar.gz (default: the "
            "store, content-addressed and shared by jobs with the same source).",
            sagemaker="same",
        ),
    ] = None
    disable_output_compression: Annotated[
        bool,
        Door(
            "Upload the model and output data dirs' files as they are (under output/model/ and "
            "output/data/), not packed as model.tar.gz and output.tar.gz.",
            cli="flag",
            sagemaker="same",
        ),
    ] = Field(default=False, strict=True)
    checkpoint_s3_uri: Annotated[
        str | None,
        Door(
            "Where checkpoints are synced (default: the job's store prefix).",
            old_flags=("--checkpoint-uri",),
            sagemaker="same",
        ),
    ] = None
    checkpoint_local_path: Annotated[
        str | None,
        Door(
            "The checkpoint directory on each node (default /opt/ml/checkpoints).", sagemaker="same"
        ),
    ] = None
    # TensorBoard (trainctl.node.tensorboard): what a node's scripts write under
    # tensorboard_local_path is copied to tensorboard_s3_uri while the job runs, for
    # `trainctl tensorboard`. Always on: an empty directory costs a scan, no request.
    tensorboard_s3_uri: Annotated[
        str | None,
        Door(
            "Where the nodes' TensorBoard logs are copied while the job runs (default: the "
            "job's store prefix).",
            sagemaker="mapped: tensorboard_output_config's s3_output_path",
        ),
    ] = None
    tensorboard_local_path: Annotated[
        str | None,
        Door(
            "The TensorBoard log directory on each node (default /opt/ml/output/tensorboard; "
            "the script finds it in TRAINCTL_TENSORBOARD_DIR).",
            sagemaker="mapped: tensorboard_output_config's container_local_output_path",
        ),
    ] = None
    # torch's profiler over some optimizer steps of every rank (node/worker_site), its traces
    # under the TensorBoard dir's profiler/ (TensorBoard's PyTorch profiler tab, Perfetto).
    profile: Annotated[
        str | None,
        Door(
            "START:COUNT: torch's profiler over COUNT optimizer steps after the first START, on "
            "every rank, its traces in the TensorBoard logs (profiler/).",
            metavar="START:COUNT",
            sagemaker="mapped: profiler_config's FrameworkProfile(start_step, num_steps)",
        ),
    ] = None
    max_run: Annotated[
        int, Door("Seconds of training before the job is stopped.", sagemaker="same")
    ] = Field(default=86400, ge=1, le=28 * 86400, strict=True)
    # The work the job has to do, for its progress, time left and the deadline policy
    # (trainctl.controller.deadline); None: the script may say it (report_step(total_steps=N)).
    total_steps: Annotated[
        int | None,
        Door(
            "The job's training steps in all (what report_step counts), for its progress, time "
            "left and the spot deadline policy; a script can say it itself: "
            "report_step(step, total_steps=N)."
        ),
    ] = Field(default=None, ge=1, le=10**12, strict=True)
    job_name: Annotated[
        str | None,
        Door(
            "The job's name (default: the script's name and a timestamp).",
            sagemaker="mapped: fit()'s job_name",
        ),
    ] = None
    metric_definitions: Annotated[
        list[MetricDefinition],
        Door(
            "NAME=REGEX: a metric read from the logs (one capture group: the value).",
            cli="own",
            metavar="NAME=REGEX",
            sagemaker="same",
        ),
    ] = Field(default_factory=list)
    image_uri: Annotated[
        str | None,
        Door("The container image the nodes run in.", old_flags=("--image",), sagemaker="same"),
    ] = None
    # Building the job's image (trainctl.image.build): on base_image, or on the framework
    # image for framework_version/py_version; plus requirements.txt and `dependencies`.
    build_image: Annotated[
        bool, Door("Build the job's image (see `trainctl build`).", cli="flag")
    ] = Field(default=False, strict=True)
    framework_version: Annotated[
        str | None, Door("PyTorch version of the framework image, e.g. 2.5.1.", sagemaker="same")
    ] = None
    py_version: Annotated[
        str | None, Door("Python of the framework image, e.g. py311.", sagemaker="same")
    ] = None
    dependencies: Annotated[
        list[str],
        Door(
            "A pip requirement for the built image; repeatable.",
            cli="repeated",
            old_flags=("--dependency",),
            metavar="REQUIREMENT",
            sagemaker="mapped: SageMaker's are directories copied beside the source",
        ),
    ] = Field(default_factory=list)
    base_image: Annotated[str | None, Door("FROM of the built image.")] = None
    max_restarts: Annotated[
        int,
        Door("Relaunches after the user's code fails (infrastructure failures always relaunch)."),
    ] = Field(default=0, ge=0, le=100, strict=True)
    max_retry_attempts: Annotated[
        int | None,
        Door(
            "Relaunches after infrastructure failures (a node lost, capacity taken back) before "
            "the job fails (default: no limit).",
            sagemaker="same",
        ),
    ] = Field(default=None, ge=1, le=30, strict=True)
    # Elastic: run on as few as this many nodes when instance_count cannot be had (None:
    # always instance_count, waiting for capacity).
    min_instance_count: Annotated[
        int | None,
        Door("Elastic: go on with as few as this many nodes when instance_count cannot be had."),
    ] = Field(default=None, strict=True)
    max_wait: Annotated[
        int | None,
        Door("Seconds the whole job may take, waits and relaunches included.", sagemaker="same"),
    ] = Field(default=None, ge=1, le=28 * 86400, strict=True)
    faults: Annotated[
        list[str],
        Door(
            "A fault to inject: kill:NODE@WHEN, notice:NODE@WHEN or "
            "nocapacity:NODE@WHEN[+SECONDS], WHEN seconds into the attempt's training or "
            "stepN (once the script reports step N); repeatable.",
            cli="repeated",
            old_flags=("--inject-fault",),
            metavar="KIND:NODE@WHEN",
        ),
    ] = Field(default_factory=list)
    # Capacity (the EC2 and SSH providers'; see trainctl.spec.capacity; a plug-in's own are
    # its options block, provider_options). A pool fills those unset.
    pool: Annotated[
        str | None, Door("A resource pool from config.yaml (fills the capacity fields not given).")
    ] = None
    region: Annotated[Region, Door("AWS region.")] = None
    use_spot_instances: Annotated[
        bool,
        Door(
            "EC2 spot capacity (default: on-demand).",
            cli="flag",
            old_flags=("--spot/--on-demand",),
            sagemaker="same",
        ),
    ] = Field(default=False, strict=True)
    on_demand_fallback: Annotated[
        bool,
        Door(
            "Spot capacity short: fall back to on-demand (with max_wait: once waiting longer "
            "for spot would miss it, max_run's training still to come); back to spot once "
            "it returns (setting spot_probe_seconds).",
            cli="flag",
        ),
    ] = Field(default=False, strict=True)
    fallback_instance_types: Annotated[
        list[str],
        Door(
            "The next EC2 type to try when capacity is short; repeatable, in order.",
            cli="repeated",
            old_flags=("--fallback-instance-type",),
            metavar="TYPE",
        ),
    ] = Field(default_factory=list)
    subnets: Annotated[
        SubnetIds,
        Door(
            "subnet-...; repeatable, tried in order.",
            cli="repeated",
            old_flags=("--subnet",),
            metavar="SUBNET",
            sagemaker="same",
        ),
    ] = Field(default_factory=list)
    security_group_ids: Annotated[
        SecurityGroupIds,
        Door(
            "sg-...; repeatable (default: one made for the job).",
            cli="repeated",
            old_flags=("--security-group",),
            metavar="SG",
            sagemaker="same",
        ),
    ] = Field(default_factory=list)
    image_id: Annotated[ImageId, Door("The nodes' AMI: ami-... or resolve:ssm:NAME.")] = None
    instance_profile: Annotated[
        str | None, Door("The nodes' IAM instance profile.", sagemaker="mapped: from role")
    ] = Field(default=None, min_length=1, max_length=2048)
    # Root volume of an EC2 instance, GB (None: DEFAULT_VOLUME_GB); nothing else has one.
    volume_size: Annotated[
        int | None,
        Door(f"Root volume of an EC2 node, GB (default {DEFAULT_VOLUME_GB}).", sagemaker="same"),
    ] = Field(default=None, ge=8, le=16384, strict=True)
    volume_kms_key: Annotated[
        KmsKeyId,
        Door(
            "The KMS key (id, alias/NAME or ARN) that encrypts EC2 nodes' root volumes (default: "
            "the account's EBS key).",
            sagemaker="same",
        ),
    ] = None
    tags: Annotated[
        dict[str, str],
        Door(
            "KEY=VALUE: a tag on the job's EC2 instances, volumes and network interfaces, beside "
            "trainctl's own; repeatable.",
            cli="pairs",
            metavar="KEY=VALUE",
            sagemaker="mapped: tags' [{'Key': ..., 'Value': ...}]",
        ),
    ] = Field(default_factory=dict)
    hosts: Annotated[
        list[SshHost],
        Door(
            "[USER@]ADDRESS[:PORT] of an SSH host (instance_type ssh); repeatable.",
            cli="own",
            old_flags=("--host",),
            metavar="[USER@]ADDRESS[:PORT]",
        ),
    ] = Field(default_factory=list)
    # The options of a provider plug-in (trainctl.plugin.ProviderPlugin.options), by
    # plug-in name: a plug-in declares its own fields once, in its own package.
    provider_options: Annotated[
        dict[str, dict[str, Any]],
        Door(
            "PLUGIN=JSON: a provider plug-in's options as one JSON object (a job file's block "
            "under the plug-in's name; each installed plug-in's options are also flags of their "
            "own, e.g. --slurm-partition).",
            cli="typed",
            metavar="PLUGIN=JSON",
        ),
    ] = Field(default_factory=dict)
    # Warm capacity (EC2): after the job, its healthy instances stay up this long for the
    # next job with the same capacity spec (SageMaker's warm pools; 0: terminate at once).
    keep_alive_period_in_seconds: Annotated[
        int,
        Door(
            "Keep the job's EC2 instances warm this long after it (0-3600 s) for the next job with"
            " the same capacity spec; `trainctl warm` lists them.",
            old_flags=("--keep-alive",),
            sagemaker="same",
        ),
    ] = Field(default=0, ge=0, le=MAX_KEEP_ALIVE_SECONDS, strict=True)
    # Where the job's controller runs (trainctl.spec.controller): local, ssh://..., a pool, ec2.
    controller: Annotated[
        str,
        Door(
            "Where the job's controller runs: local (this machine), ssh://[user@]host[:port], an "
            "ssh pool's name, or ec2 (a small instance of its own). A remote one keeps the job "
            "going when this machine goes away."
        ),
    ] = "local"
    # The working directory (and SM_MODEL_DIR, SM_OUTPUT_DATA_DIR) survives a relaunch
    # (trainctl.node.workdir): at most this many MB per node, newest files first (0: not
    # kept), leaving out what these gitignore-style patterns match.
    workdir_max_mb: Annotated[
        float,
        Door(
            "The working directory is kept across relaunches: at most this many MB per node (0: "
            "not kept)."
        ),
    ] = Field(default=1024, ge=0, le=1024 * 1024)
    workdir_ignore: Annotated[
        list[str],
        Door(
            "A gitignore-style pattern of working-directory files not to keep; repeatable.",
            cli="repeated",
            metavar="PATTERN",
        ),
    ] = Field(default_factory=list)
    # Names whose values are shown as <redacted> everywhere trainctl shows the job (status,
    # logs, events, the dashboard), besides those that look secret (trainctl.redact); the
    # script still gets the real values.
    secret_env: Annotated[
        list[str],
        Door(
            "An environment NAME whose value is shown as <redacted> (names with SECRET, TOKEN, "
            "PASSWORD, KEY... already are); repeatable.",
            cli="repeated",
            metavar="NAME",
        ),
    ] = Field(default_factory=list)
    secret_hyperparameters: Annotated[
        list[str],
        Door(
            "A hyperparameter KEY whose value is shown as <redacted>; repeatable.",
            cli="repeated",
            old_flags=("--secret-hyperparameter",),
            metavar="KEY",
        ),
    ] = Field(default_factory=list)

    @field_validator("arguments", mode="before")
    @classmethod
    def _arguments(cls, v: Any) -> Any:
        return check_arguments(v)

    @field_validator("workdir_ignore")
    @classmethod
    def _workdir_ignore(cls, v: list[str]) -> list[str]:
        return check_workdir_ignore(v)

    @field_validator("controller")
    @classmethod
    def _controller(cls, v: str) -> str:
        from trainctl.spec.controller import check_controller

        return check_controller(v)

    @field_validator("pool")
    @classmethod
    def _pool(cls, v: str | None) -> str | None:
        if v is not None and not POOL_NAME_RE.fullmatch(v):
            raise ValueError(f"{v!r} is not a pool name (letters, digits, '_', '-', '.')")
        return v

    @field_validator("fallback_instance_types")
    @classmethod
    def _fallback_types(cls, v: list[str]) -> list[str]:
        from trainctl.spec.catalog import check_instance_type

        for name in v:
            if check_instance_type(name).provider != "aws":
                raise ValueError(f"{name!r} is not an EC2 instance type")
        return v

    @property
    def provider(self) -> str:
        """The provider's name, from the instance type: 'local', 'ssh', 'aws' or a plug-in's."""
        from trainctl.spec.catalog import CATALOG

        return CATALOG[self.instance_type].provider

    @property
    def aws(self) -> AwsOptions:
        """The options only EC2 reads, as a block (the fields stay flat)."""
        return AwsOptions(**{name: getattr(self, name) for name in AwsOptions.model_fields})

    @property
    def ssh(self) -> SshOptions:
        """The options only the SSH provider reads, as a block (the fields stay flat)."""
        return SshOptions(**{name: getattr(self, name) for name in SshOptions.model_fields})

    @property
    def instance_types(self) -> list[str]:
        """The instance type, then the fallbacks, in the order capacity is tried."""
        return [self.instance_type, *self.fallback_instance_types]

    @field_validator("faults")
    @classmethod
    def _faults(cls, v: list[str]) -> list[str]:
        return [str(Fault.parse(f)) for f in v]

    @property
    def root_volume_gb(self) -> int:
        return self.volume_size or DEFAULT_VOLUME_GB

    @property
    def elastic(self) -> bool:
        """Whether the job may run on fewer than instance_count nodes."""
        return self.min_instance_count is not None and self.min_instance_count < self.instance_count

    @property
    def min_nodes(self) -> int:
        return self.min_instance_count or self.instance_count

    @property
    def parsed_faults(self) -> list[Fault]:
        return [Fault.parse(f) for f in self.faults]

    @field_validator("entry_point")
    @classmethod
    def _entry_point_relative(cls, v: str) -> str:
        if not v or not v.strip():
            raise ValueError("is required (the script to run, e.g. train.py)")
        return v

    @field_validator("instance_type", mode="before")
    @classmethod
    def _sagemaker_instance_type(cls, v: Any) -> Any:
        from trainctl.spec.catalog import ec2_name

        return ec2_name(v)

    @field_validator("fallback_instance_types", mode="before")
    @classmethod
    def _sagemaker_fallback_types(cls, v: Any) -> Any:
        from trainctl.spec.catalog import ec2_name

        return [ec2_name(t) for t in v] if isinstance(v, list) else v

    @field_validator("instance_type")
    @classmethod
    def _known_instance_type(cls, v: str) -> str:
        from trainctl.spec.catalog import check_instance_type

        check_instance_type(v)
        return v

    @field_validator("hyperparameters")
    @classmethod
    def _hp_json(cls, v: dict[str, Any]) -> dict[str, Any]:
        return check_hyperparameters(v)

    @field_validator("inputs")
    @classmethod
    def _channel_envs(cls, v: dict[str, str]) -> dict[str, str]:
        _check_channel_envs(v)
        return v

    @field_validator("environment")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        for key in v:
            if not ENV_NAME_RE.fullmatch(key):
                raise ValueError(f"{key!r} is not a valid environment variable name")
        check_environment(v)
        return v

    @field_validator("secret_env", "secret_hyperparameters")
    @classmethod
    def _secret_names(cls, v: list[str]) -> list[str]:
        for name in v:
            if not name or len(name) > 256 or "\0" in name:
                raise ValueError(f"{name!r} is not a name (1-256 characters)")
        return v

    @field_validator("provider_options")
    @classmethod
    def _plugin_options(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        # Read back from a record (a node, a machine without the plug-in): checked at submit.
        if info.context and info.context.get(RECORDED):
            return v
        from pydantic import ValidationError

        from trainctl.spec.catalog import plugin_blocks

        blocks = plugin_blocks()
        out = {}
        for name, values in v.items():
            if name not in blocks:
                known = ", ".join(sorted(blocks)) or "none installed"
                raise ValueError(f"{name!r} is no provider plug-in with options ({known})")
            try:
                options = blocks[name].model_validate(values)
            except ValidationError as exc:
                err = exc.errors()[0]
                where = ".".join(str(p) for p in (name, *err["loc"]))
                msg = err["msg"].removeprefix("Value error, ")
                if err["type"] == "extra_forbidden":
                    msg = f"unknown option; allowed: {', '.join(blocks[name].model_fields)}"
                raise ValueError(f"{where}: {msg}") from None
            out[name] = options.model_dump(mode="json", exclude_unset=True)
        return out

    @field_validator("output_path", "checkpoint_s3_uri", "tensorboard_s3_uri", "code_location")
    @classmethod
    def _uris(cls, v: str | None, info: Any) -> str | None:
        return None if v is None else _check_uri(v, info.field_name)

    @field_validator("checkpoint_local_path", "tensorboard_local_path")
    @classmethod
    def _abs_path(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if not v.startswith("/"):
            raise ValueError("must be an absolute path (e.g. /opt/ml/checkpoints)")
        if ".." in v.split("/") or any(ord(c) < 32 for c in v):
            raise ValueError("must be a plain absolute path without '..' or control characters")
        if (why := system_path(v)) is not None:
            raise ValueError(
                f"{v} {why}: the node uploads what this directory holds and writes into it; "
                "use a directory of the job's own (default /opt/ml/checkpoints)"
            )
        return v

    @field_validator("tags")
    @classmethod
    def _tags(cls, v: dict[str, str]) -> dict[str, str]:
        return check_tags(v)

    @field_validator("profile")
    @classmethod
    def _profile(cls, v: str | None) -> str | None:
        if v is not None and profile_steps(v) is None:
            raise ValueError(
                f"{v!r} is not START:COUNT (optimizer steps: START >= 0, COUNT 1-1000; e.g. 10:5)"
            )
        return v

    @field_validator("job_name")
    @classmethod
    def _job_name(cls, v: str | None) -> str | None:
        if v is not None and not JOB_NAME_RE.fullmatch(v):
            raise ValueError(
                f"{v!r} is invalid: 1-63 letters, digits and hyphens, starting and ending "
                "with a letter or digit"
            )
        return v

    @field_validator("image_uri", "base_image")
    @classmethod
    def _image(cls, v: str | None) -> str | None:
        if v is not None and not IMAGE_URI_RE.fullmatch(v):
            raise ValueError(f"{v!r} is not an image reference like registry/repo:tag")
        return v

    @field_validator("framework_version")
    @classmethod
    def _framework_version(cls, v: str | None) -> str | None:
        from trainctl.spec.frameworks import resolve_framework_version

        if v is not None:
            try:
                resolve_framework_version(v)
            except SpecError as exc:
                raise ValueError(exc.message) from None
        return v

    @field_validator("dependencies")
    @classmethod
    def _dependencies(cls, v: list[str]) -> list[str]:
        from trainctl.spec.frameworks import check_dependencies

        try:
            return check_dependencies(v)
        except SpecError as exc:
            raise ValueError(exc.message) from None

    @model_validator(mode="after")
    def _container_command(self) -> JobSpec:
        # Raised with the field named in the text (a model-level error has no location).
        if self.container_arguments and not self.container_entry_point:
            raise ValueError(
                "container_arguments: given without container_entry_point (the script's own "
                "arguments are `arguments`)"
            )
        if self.container_entry_point and self.launcher != "python":
            raise ValueError(
                "container_entry_point: runs once per node and starts its own processes; "
                "give no distribution with it"
            )
        if any(not word or "\0" in word for word in self.container_entry_point):
            raise ValueError("container_entry_point: an empty word, or one with a NUL byte")
        return self

    @model_validator(mode="after")
    def _across_fields(self, info: ValidationInfo) -> JobSpec:
        # A spec read back from a job record (by a node agent, on a machine or in an image
        # without the user's source_dir) was checked at submit; the source is in the store.
        if info.context and info.context.get(RECORDED):
            return self
        check_across_fields(self)
        return self

    @property
    def builds_image(self) -> bool:
        """Whether the job's image is built for it: asked for (build_image), or a framework
        image chosen by framework_version, which gets the trainctl toolkit (the agent) added
        on top - AWS's images carry SageMaker's toolkit, not this one."""
        return self.image_uri is None and (self.build_image or self.framework_version is not None)

    @property
    def launcher(self) -> str:
        return self.distribution.launcher if self.distribution else "python"

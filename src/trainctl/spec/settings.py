"""Layered configuration: defaults < ~/.trainctl/config.yaml < TRAINCTL_* environment."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from trainctl.spec.capacity import PoolConfig, check_proxy_jump
from trainctl.spec.home import trainctl_home


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TRAINCTL_", extra="forbid")

    home: Path = Field(
        default_factory=trainctl_home,
        description="Where trainctl keeps its default store (HOME/store), config.yaml and the "
        "local node directories; default ~/.trainctl.",
    )
    store: str = Field(
        default="",
        description="Root URI of the job store (file:// or s3://); default file://HOME/store.",
    )
    max_source_mb: float = Field(default=100.0, gt=0, description="Largest source_dir accepted.")
    log_sync_seconds: float = Field(
        default=10.0,
        gt=0,
        description="How often a node agent copies its log to the store, when it has new "
        "lines (longer in jobs of thousands of nodes: see paced). The terminal that runs "
        "the job shows each line as it comes; `trainctl logs` elsewhere is this far behind.",
    )
    progress_save_seconds: float = Field(
        default=2.0,
        gt=0,
        description="How often the controller saves a job's progress (its steps and metric "
        "values) to the record, where `status` and the dashboard read it, when it moved. A "
        "spot replay (`trainctl estimate`), which nobody watches, saves it once an hour.",
    )
    stop_check_seconds: float = Field(
        default=1.0,
        gt=0,
        description="How often the controller of a running attempt looks in the store for "
        "a stop request (`trainctl stop`, `Estimator.stop()`): a stop begins within this "
        "long; each look is one read of the store. A spot replay, which nobody stops, looks "
        "once an hour.",
    )
    control_poll_seconds: float = Field(
        default=10.0,
        gt=0,
        description="How often a node agent reads its job's lease in the store: whether the "
        "controller is alive, and the interruption notices the controller relays (a "
        "relaunch by choice, an injected fault, a stop of an adopted node) to a node it did "
        "not start itself; a node it started (a local one, on this machine) hears them at "
        "once over its pipe. EC2's own spot notice comes from IMDS every imds_poll_seconds.",
    )
    lease_seconds: float = Field(
        default=15.0, gt=0, description="A controller lease older than this is stale."
    )
    orphan_timeout_seconds: float = Field(
        default=300.0,
        gt=0,
        description="A node whose controller's lease has been stale this long shuts down.",
    )
    notice_grace_seconds: float = Field(
        default=120.0,
        ge=0,
        description="After an interruption notice, how long workers get to checkpoint.",
    )
    node_sandbox: bool = Field(
        default=True,
        description="Run each local, Slurm or SSH node's processes in a mount namespace of "
        "their own: the store, trainctl's home and other nodes' folders empty, the node's "
        "layout at /opt/ml (trainctl.node.sandbox).",
    )
    checkpoint_sync_seconds: float = Field(
        default=0.5, gt=0, description="How often a node looks for new checkpoint files."
    )
    workdir_sync_seconds: float = Field(
        default=2.0,
        gt=0,
        description="How often a node copies new files of its working directory (and model and "
        "output data dirs) to the store, so that a relaunch starts with them.",
    )
    tensorboard_sync_seconds: float = Field(
        default=5.0,
        gt=0,
        description="How often a node copies new TensorBoard log data to the store (what "
        "`trainctl tensorboard` shows of a running job is this far behind).",
    )
    imds: bool = Field(
        default=False,
        description="The node agent runs on EC2 and polls IMDSv2 for spot interruption "
        "notices (providers set TRAINCTL_IMDS=1 for their agents).",
    )
    notice_signals: str = Field(
        default="",
        pattern=r"^((TERM|USR1|HUP)(,(TERM|USR1|HUP))*)?$",
        description="Signals that reach the node agent as an interruption notice from a "
        "scheduler (Slurm's preemption and time-limit warnings: the Slurm provider sets "
        "TERM,USR1), e.g. TERM,USR1; the agent's own stop then comes as SIGUSR2.",
    )
    imds_poll_seconds: float = Field(
        default=5.0,
        gt=0,
        description="How often a node agent on EC2 polls spot/instance-action (AWS: every 5 s).",
    )
    heartbeat_seconds: float = Field(
        default=5.0, gt=0, description="How often a node agent reports that it is alive."
    )
    heartbeat_timeout_seconds: float = Field(
        default=60.0,
        gt=0,
        description="A node silent this long is considered lost. A node's status in the "
        "store (what a controller that takes a job over follows) is written when it changes "
        "and a third of this apart otherwise.",
    )
    elastic_wait_seconds: float = Field(
        default=120.0,
        gt=0,
        description="An elastic job (min_instance_count) that lost a node waits this long for "
        "a replacement before going on with the nodes it has; then it keeps looking for the "
        "capacity and grows back at a checkpoint once it comes.",
    )
    elastic_probe_seconds: float = Field(
        default=900.0,
        gt=0,
        description="An elastic job below its full size on a provider that cannot tell its "
        "capacity without launching (EC2) tries the full size again after this long "
        "training: a checkpoint and a relaunch, shrinking back if the capacity is not there.",
    )
    spot_probe_seconds: float = Field(
        default=3600.0,
        ge=0,
        description="A spot job that fell back to on-demand capacity (on_demand_fallback) "
        "tries spot again after this long training on demand, doubling after each try that "
        "finds none: a checkpoint and a relaunch, back on demand if spot is still short. "
        "Only a job that saves state and, with a max_wait, has the slack for a relaunch; "
        "0: never.",
    )
    min_restart_seconds: float = Field(
        default=60.0,
        ge=0,
        description="The least a relaunch is taken to cost in the spot deadline policy "
        "(Uniform Progress: the lead over the line to the deadline before a job leaves "
        "on-demand for spot is two restarts); the attempts' measured start-ups when longer.",
    )
    startup_timeout_seconds: float = Field(
        default=1800.0,
        ge=0,
        description="An attempt whose nodes report no training step and print no new log "
        "line for this long before the first step has hung: it fails (0: never). Repeated "
        "lines (the same text with other numbers) are not new.",
    )
    progress_timeout_seconds: float = Field(
        default=1800.0,
        ge=0,
        description="After the first step: no step and no new log line for this long and "
        "the attempt has hung: it fails (0: never).",
    )
    hang_pace_factor: float = Field(
        default=4.0,
        ge=0,
        description="A relaunched attempt has hung once it goes this many times the longest "
        "quiet stretch (no step, no new log line) of the job's earlier attempts without "
        "progress, never less than hang_floor_seconds (plus time to load what its nodes "
        "restored), when that is shorter than the timeouts above: each rank's Python stack "
        "goes to the node log and the failure names where it waits. 0: the timeouts alone.",
    )
    hang_floor_seconds: float = Field(
        default=120.0,
        ge=0,
        description="The least a relaunched attempt may go without progress before it counts "
        "as hung (see hang_pace_factor).",
    )
    stop_grace_seconds: float = Field(
        default=10.0, ge=0, description="SIGTERM to SIGKILL grace when a job is stopped."
    )
    gpu_health_check: bool = Field(
        default=True,
        description="Before training, each node agent checks its GPUs (as many as the "
        "instance type has, none already running another process, no uncorrected ECC "
        "errors); a node that fails is replaced like a lost node.",
    )
    gpu_busy_fails_node: bool = Field(
        default=True,
        description="A GPU already running another process fails the health check. The "
        "local provider turns this off for its nodes: the machine is the user's own (a "
        "notebook holding the GPU, say) and replacing a node there gives the same GPU, so "
        "the node's log warns instead.",
    )
    poweroff_when_orphaned: bool = Field(
        default=False,
        description="A node agent whose controller is gone past orphan_timeout_seconds also "
        "halts its machine (cloud providers set TRAINCTL_POWEROFF_WHEN_ORPHANED=1).",
    )
    container_engine: str = Field(
        default="",
        pattern=r"^(|docker|podman|none)$",
        description="Container engine for builds and container jobs: docker or podman "
        "(default: whichever is installed, docker first); none: use no engine, as on a "
        "machine without one (SageMaker's framework_version then runs as processes).",
    )
    image_repository: str = Field(
        default="",
        description="Where images built for ssh and EC2 jobs (build_image=True) are pushed "
        "so their hosts can pull them: registry/name or an ECR repository URI (created if "
        "missing).",
    )
    node_environment: dict[str, str] = Field(
        default_factory=dict,
        description="Extra environment for every remote node agent (e.g. AWS_ENDPOINT_URL of "
        "an S3-compatible store). Shown in dry runs: never put credentials here; nodes get "
        "theirs from the instance profile.",
    )
    # EC2 provider (trainctl.provisioning.aws).
    aws_ssh_cidr: str | None = Field(
        default=None,
        description="CIDR allowed to SSH (port 22) into a job's EC2 nodes, e.g. 203.0.113.7/32. "
        "Unset: this machine's public address, looked up at provision time from "
        "https://checkip.amazonaws.com.",
    )
    aws_default_image: str = Field(
        default="resolve:ssm:/aws/service/deeplearning/ami/x86_64/"
        "oss-nvidia-driver-gpu-pytorch-2.9-ubuntu-24.04/latest/ami-id",
        description="Image of EC2 nodes when a job gives no image_id: an AMI id or "
        "resolve:ssm:<public parameter> (default: the AWS Deep Learning AMI with PyTorch).",
    )
    instance_profile: str | None = Field(
        default=None,
        min_length=1,
        description="Instance profile (name or ARN) of EC2 nodes for jobs that name none: "
        "their role reaches the store. trainctl.sagemaker.get_execution_role() returns it.",
    )
    aws_node_python: str = Field(
        default="/opt/pytorch/bin/python",
        description="Interpreter that runs the node agent on EC2 nodes (the PyTorch DLAMI's).",
    )
    aws_capacity_wait_seconds: float = Field(
        default=3600.0,
        gt=0,
        description="How long EC2 capacity is retried (subnets, types, markets) when a job "
        "sets no max_wait.",
    )
    aws_boot_timeout_seconds: float = Field(
        default=900.0, gt=0, description="How long launched EC2 nodes get to reach 'running'."
    )
    aws_cleanup_timeout_seconds: float = Field(
        default=900.0,
        gt=0,
        description="How long terminate waits for a job's instances to end before deleting its "
        "security group and placement group.",
    )
    aws_cluster_placement_group: bool = Field(
        default=True,
        description="Put a multi-node EC2 job in a cluster placement group (lowest latency "
        "between nodes). Off: capacity is easier to find, and no placement group is made, "
        "looked up or deleted (for endpoints without placement groups, such as moto).",
    )
    ssh_user: str = Field(
        default="ubuntu",
        pattern=r"^[a-z_][a-z0-9_-]{0,31}$",
        description="Login user on EC2 nodes (the Ubuntu DLAMI's).",
    )
    ssh_proxy_jump: str | None = Field(
        default=None,
        description="Jump host(s) for every node without its own proxy_jump (EC2 nodes, whose "
        "private addresses are then used): OpenSSH ProxyJump syntax, "
        "'[user@]bastion[:port][,...]'. Each hop's host key is pinned like a node's.",
    )
    ssh_address_override: list[str] = Field(
        default_factory=list,
        description="TEST SEAM: 'host[:port]' by node rank, replacing the EC2 nodes' addresses "
        "(SSH and node-to-node), so loopback sshd servers can stand in for instances; with "
        "loopback addresses each node's layout root is HOME/nodes/<job>/attempt-<n>/node-<r> "
        "and NCCL/gloo use lo.",
    )

    @field_validator("ssh_proxy_jump")
    @classmethod
    def _proxy_jump(cls, v: str | None) -> str | None:
        return check_proxy_jump(v)

    # Remote controllers (Estimator(controller=...); trainctl.controller.service).
    controller_python: str = Field(
        default="python3",
        min_length=1,
        description="Interpreter that runs the controller service on an ssh:// controller "
        "host (a pool's host uses its own `python`).",
    )
    controller_idle_seconds: float = Field(
        default=600.0,
        gt=0,
        description="A remote controller service with no job to supervise for this long "
        "exits; an EC2 controller instance then terminates itself.",
    )
    controller_start_timeout_seconds: float = Field(
        default=180.0,
        gt=0,
        description="How long submit waits for a remote controller to take the job's lease "
        "(an EC2 controller's boot included).",
    )
    controller_instance_type: str = Field(
        default="t3.small",
        pattern=r"^[a-z][a-z0-9-]*\.[a-z0-9]+$",
        description="Instance type of the EC2 controller (on-demand; burstable is plenty).",
    )
    controller_instance_profile: str = Field(
        default="trainctl-controller",
        min_length=1,
        description="Instance profile of the EC2 controller: allowed to manage trainctl's EC2 "
        "resources and the store's S3 prefix (`trainctl controller-policy` prints the policy).",
    )
    controller_image: str = Field(
        default="resolve:ssm:/aws/service/canonical/ubuntu/server/24.04/stable/current/amd64/"
        "hvm/ebs-gp3/ami-id",
        description="Image of the EC2 controller: an AMI id or resolve:ssm:<public parameter> "
        "(default: Ubuntu 24.04; it needs no GPU driver).",
    )
    controller_ssh_address_override: str = Field(
        default="",
        description="TEST SEAM: 'host[:port]' replacing the EC2 controller's address, so a "
        "loopback sshd server can stand in for it.",
    )

    # Config-file-only: named resource pools (trainctl.spec.capacity), typed so typos fail.
    pools: dict[str, PoolConfig] = Field(default_factory=dict)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        yaml_file = trainctl_home() / "config.yaml"
        return (
            init_settings,
            env_settings,
            YamlConfigSettingsSource(settings_cls, yaml_file=yaml_file),
        )

    @property
    def store_uri(self) -> str:
        return self.store or (self.home / "store").resolve().as_uri()

    # -- what a node agent asks of the store, and how often (docs/benchmarks.md, "Scale") --

    def log_ship_seconds(self, nodes: int) -> float:
        """How often each of a job of `nodes` nodes copies its log to the store."""
        return paced(self.log_sync_seconds, nodes)

    def control_seconds(self, nodes: int) -> float:
        """How often each node reads the job's lease (its controller's liveness, notices)."""
        return paced(self.control_poll_seconds, nodes)

    def status_seconds(self, nodes: int) -> float:
        """How often a node writes its status to the store when nothing in it changed: well
        within heartbeat_timeout_seconds, after which a controller following the node
        through the store (a takeover's) counts it lost."""
        return paced(max(self.heartbeat_seconds, self.heartbeat_timeout_seconds / 3), nodes)


# Each kind of request that every node of a job makes on its own schedule (the log copy, the
# status write, the lease read) is spaced so that the job's nodes together make at most this
# many a second: three kinds, 1,500 a second in all, under S3's 3,500 PUT and 5,500 GET a
# second per prefix (https://docs.aws.amazon.com/AmazonS3/latest/userguide/optimizing-
# performance.html) with room for the controller, checkpoints and a prefix S3 has not yet
# partitioned. It binds from 5,000 nodes up; below that the settings alone set the pace.
JOB_REQUESTS_PER_SECOND = 500.0


def paced(seconds: float, nodes: int) -> float:
    """`seconds`, or longer where a job of `nodes` nodes each making one request every
    `seconds` would pass JOB_REQUESTS_PER_SECOND."""
    return max(seconds, max(1, nodes) / JOB_REQUESTS_PER_SECOND)


@lru_cache(maxsize=8)
def _cached(home: str, env_key: tuple[tuple[str, str], ...], config_mtime: int) -> Settings:
    from pydantic import ValidationError

    from trainctl.errors import SpecError

    try:
        return Settings()
    except ValidationError as exc:
        # One line naming the setting, as for any bad input (config.yaml or TRAINCTL_*).
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        msg = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown setting"
        source = Path(home) / "config.yaml"
        raise SpecError(where, f"{msg} (in {source} or TRAINCTL_* environment)") from None


def get_settings() -> Settings:
    """Settings for the current environment (re-read when TRAINCTL_* variables or
    config.yaml change)."""
    env_key = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("TRAINCTL_")))
    home = trainctl_home()
    try:
        mtime = (home / "config.yaml").stat().st_mtime_ns
    except OSError:
        mtime = 0
    return _cached(str(home), env_key, mtime)

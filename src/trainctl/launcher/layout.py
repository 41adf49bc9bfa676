"""The SageMaker-compatible in-node contract: /opt/ml paths and SM_* environment.

Pure functions of (spec, cluster, rank, layout root), so the exact environment a node gets
can be asserted in tests and shown in a dry run. On cloud hosts the root is '/', off the
cloud it is a per-node directory and every variable points there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainctl.cluster import ClusterInfo
from trainctl.spec.checks import env_suffix
from trainctl.spec.job import JobSpec


@dataclass(frozen=True)
class Layout:
    root: Path

    @property
    def ml(self) -> Path:
        return self.root / "opt" / "ml"

    @property
    def private(self) -> Path:
        """What of the node is the job's alone (owner-only): the per-node root off the
        cloud; on a cloud host, whose root is '/', /opt/ml (never the machine's root)."""
        return self.ml if self.root == Path("/") else self.root

    @property
    def ranks(self) -> Path:
        """Where the job's rank processes register (trainctl.node.ranks)."""
        return self.ml / ".trainctl" / "ranks"

    @property
    def workdir_staging(self) -> Path:
        """Where the working-directory sync keeps its frozen copies (node.workdir)."""
        return self.ml / ".trainctl" / "workdir-staging"

    @property
    def code(self) -> Path:
        return self.ml / "code"

    @property
    def input(self) -> Path:
        return self.ml / "input"

    @property
    def config(self) -> Path:
        return self.input / "config"

    @property
    def data(self) -> Path:
        return self.input / "data"

    def channel(self, name: str) -> Path:
        return self.data / name

    @property
    def model(self) -> Path:
        return self.ml / "model"

    @property
    def output(self) -> Path:
        return self.ml / "output"

    @property
    def output_data(self) -> Path:
        return self.output / "data"

    @property
    def failure(self) -> Path:
        return self.output / "failure"

    def checkpoints(self, spec: JobSpec) -> Path:
        """The local checkpoint dir; '/opt/ml/...' paths are rebased onto the layout root."""
        return self.rebased(spec.checkpoint_local_path or "/opt/ml/checkpoints")

    def tensorboard(self, spec: JobSpec) -> Path:
        """The local TensorBoard log dir (SageMaker's default: /opt/ml/output/tensorboard)."""
        return self.rebased(spec.tensorboard_local_path or "/opt/ml/output/tensorboard")

    def rebased(self, path: str) -> Path:
        """A node path as the job names it: '/opt/ml/...' is under the layout root."""
        if path == "/opt/ml" or path.startswith("/opt/ml/"):
            return self.root / path.lstrip("/")
        return Path(path)

    def all_dirs(self, spec: JobSpec) -> list[Path]:
        return [
            self.code,
            self.config,
            self.data,
            self.model,
            self.output_data,
            self.checkpoints(spec),
            self.tensorboard(spec),
        ]


# Where a job whose arguments hold a secret keeps them (written by the node, owner-only):
# relative to the code directory, which is every launcher's working directory on every host.
ARGV_FILE = "../input/config/argv.json"
SCRIPT_MAIN = "trainctl.launcher.script_main"


def hides_arguments(spec: JobSpec) -> bool:
    """Whether the script's arguments hold a secret hyperparameter (by name, or declared in
    secret_hyperparameters): then they stay off the command line every user can read."""
    from trainctl.redact import Redactor

    return bool(Redactor.for_spec(spec).hp_names)


def entry_argv(spec: JobSpec, *, module_flag: str = "-m") -> list[str]:
    """What follows the interpreter (or torchrun's options): the entry point and its
    arguments, or, where those hold a secret, trainctl.launcher.script_main reading them
    from ARGV_FILE (`module_flag`: how the runner is told that a module follows)."""
    if hides_arguments(spec):
        return [module_flag, SCRIPT_MAIN, ARGV_FILE, spec.entry_point]
    return [spec.entry_point, *script_args(spec)]


def script_args(spec: JobSpec) -> list[str]:
    """What the entry point gets after its name: the job's `arguments`, then each
    hyperparameter as `--key value`."""
    return [
        *spec.arguments,
        *hyperparameter_args(spec.hyperparameters, spec.hyperparameter_style),
    ]


def hyperparameter_args(hyperparameters: dict[str, Any], style: str = "python") -> list[str]:
    """`--key value` pairs, keys verbatim (SageMaker semantics: 'batch-size' stays as is)."""
    args: list[str] = []
    for key, value in hyperparameters.items():
        args += [f"--{key}", format_hp_value(value, style)]
    return args


def format_hp_value(value: Any, style: str = "python") -> str:
    """A hyperparameter as the script's command line gets it: strings as they are, lists
    and mappings as JSON; a boolean `True` (`python`: SageMaker v2's toolkit) or `true`
    (`json`: SageMaker v3's drivers)."""
    if isinstance(value, str):
        return value
    if isinstance(value, (dict, list)) or value is None or style == "json":
        return json.dumps(value, default=str)
    return str(value)


def resource_config(cluster: ClusterInfo, rank: int) -> dict[str, Any]:
    return {
        "current_host": cluster.node(rank).host,
        "current_instance_type": cluster.instance_type,
        "current_group_name": "homogeneousCluster",
        "hosts": cluster.hosts,
        "instance_groups": [
            {
                "instance_group_name": "homogeneousCluster",
                "instance_type": cluster.instance_type,
                "hosts": cluster.hosts,
            }
        ],
        "network_interface_name": cluster.network_env.get("GLOO_SOCKET_IFNAME", "eth0"),
    }


def input_data_config(spec: JobSpec) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in spec.inputs:
        config = spec.channel_config.get(name)
        entry = {
            "TrainingInputMode": config.input_mode if config else "File",
            "S3DistributionType": config.distribution if config else "FullyReplicated",
        }
        if config and config.content_type:
            entry["ContentType"] = config.content_type
        out[name] = entry
    return out


def sagemaker_env(
    spec: JobSpec,
    cluster: ClusterInfo,
    rank: int,
    layout: Layout,
    *,
    num_gpus: int,
    num_cpus: int,
    source_uri: str = "",
) -> dict[str, str]:
    """The SM_* (and MASTER_*) variables for the node of this rank."""
    node = cluster.node(rank)
    channels = sorted(spec.inputs)
    user_args = script_args(spec)
    resources = resource_config(cluster, rank)
    training_env: dict[str, Any] = {
        "job_name": cluster.job,
        "hosts": cluster.hosts,
        "current_host": node.host,
        "current_host_rank": rank,
        "host_count": len(cluster.nodes),
        "master_addr": cluster.master.host,
        "master_port": cluster.master_port,
        "num_gpus": num_gpus,
        "num_cpus": num_cpus,
        "model_dir": str(layout.model),
        "output_dir": str(layout.output),
        "output_data_dir": str(layout.output_data),
        "input_dir": str(layout.input),
        "input_config_dir": str(layout.config),
        "input_data_config": input_data_config(spec),
        "resource_config": resources,
        "channel_input_dirs": {c: str(layout.channel(c)) for c in channels},
        "hyperparameters": spec.hyperparameters,
        "user_entry_point": spec.entry_point,
        "module_dir": source_uri,
        "checkpoint_dir": str(layout.checkpoints(spec)),
        "log_level": spec.container_log_level,
        **toolkit_fields(spec, cluster, rank, layout, resources),
    }
    env = {
        "SM_TRAINING_ENV": json.dumps(training_env),
        "SM_HOSTS": json.dumps(cluster.hosts),
        "SM_CURRENT_HOST": node.host,
        "SM_CURRENT_HOST_RANK": str(rank),
        "SM_HOST_COUNT": str(len(cluster.nodes)),
        "SM_MASTER_ADDR": cluster.master.host,
        "SM_MASTER_PORT": str(cluster.master_port),
        "SM_NUM_GPUS": str(num_gpus),
        "SM_NUM_CPUS": str(num_cpus),
        "SM_MODEL_DIR": str(layout.model),
        "SM_OUTPUT_DIR": str(layout.output),
        "SM_OUTPUT_DATA_DIR": str(layout.output_data),
        "SM_INPUT_DIR": str(layout.input),
        "SM_INPUT_CONFIG_DIR": str(layout.config),
        "SM_INPUT_DATA_CONFIG": json.dumps(input_data_config(spec)),
        "SM_RESOURCE_CONFIG": json.dumps(resources),
        "SM_CHECKPOINT_DIR": str(layout.checkpoints(spec)),
        # trainctl's own name (SageMaker has none; its scripts name the path they gave
        # tensorboard_output_config, which is this one on a cloud node)
        "TRAINCTL_TENSORBOARD_DIR": str(layout.tensorboard(spec)),
        # read by the worker hook (node/worker_site), which runs torch's profiler
        **({"TRAINCTL_PROFILE": spec.profile} if spec.profile else {}),
        "SM_CHANNELS": json.dumps(channels),
        "SM_HPS": json.dumps(spec.hyperparameters),
        "SM_USER_ENTRY_POINT": spec.entry_point,
        "SM_USER_ARGS": json.dumps(user_args),
        "SM_MODULE_DIR": source_uri,
        "SM_MODULE_NAME": Path(spec.entry_point).stem,
        "SM_LOG_LEVEL": str(spec.container_log_level),
        "SM_NETWORK_INTERFACE_NAME": resources["network_interface_name"],
        **{f"SM_{name}": _env_value(training_env[key]) for name, key in TOOLKIT_ENV.items()},
    }
    for channel in channels:
        env[f"SM_CHANNEL_{env_suffix(channel)}"] = str(layout.channel(channel))
    for key, value in spec.hyperparameters.items():
        env[f"SM_HP_{env_suffix(key)}"] = format_hp_value(value, spec.hyperparameter_style)
    return env


# The training toolkit's fields (sagemaker_training.environment) beyond the ones above, each
# in SM_TRAINING_ENV, and these also as SM_<NAME> (the toolkit's to_env_vars): variable
# name -> SM_TRAINING_ENV key.
TOOLKIT_ENV = {
    "FRAMEWORK_PARAMS": "additional_framework_parameters",
    **{
        key.upper(): key
        for key in (
            "current_instance_type", "current_instance_group", "current_instance_group_hosts",
            "instance_groups", "instance_groups_dict", "distribution_instance_groups",
            "is_hetero", "framework_module", "num_neurons", "output_intermediate_dir",
        )
    },
}  # fmt: skip


def framework_params(spec: JobSpec, cluster: ClusterInfo) -> dict[str, Any]:
    """What SageMaker passes as `sagemaker_*` hyperparameters and the toolkit gives as
    `additional_framework_parameters`: the instance type and the distribution asked for."""
    itype = cluster.instance_type
    params: dict[str, Any] = {
        "sagemaker_instance_type": itype if itype.startswith("local") else f"ml.{itype}"
    }
    distribution = spec.distribution
    if distribution is None:
        return params
    if distribution.launcher == "torchrun":
        params["sagemaker_torch_distributed_enabled"] = True
    if distribution.smdistributed is not None:
        params["sagemaker_distributed_dataparallel_enabled"] = True
        params["sagemaker_distributed_dataparallel_custom_mpi_options"] = ""
    if distribution.mpi is not None and distribution.launcher == "mpi":
        params["sagemaker_mpi_enabled"] = True
        params["sagemaker_mpi_num_of_processes_per_host"] = spec.processes_per_host or 1
        params["sagemaker_mpi_custom_mpi_options"] = distribution.mpi.custom_mpi_options
    return params


def toolkit_fields(
    spec: JobSpec, cluster: ClusterInfo, rank: int, layout: Layout, resources: dict[str, Any]
) -> dict[str, Any]:
    """SM_TRAINING_ENV's fields as the toolkit names them that the ones above leave out:
    the one homogeneous instance group of `resources` (resource_config), rank 0's host the
    master."""
    (group,) = resources["instance_groups"]
    return {
        "additional_framework_parameters": framework_params(spec, cluster),
        "current_instance_type": cluster.instance_type,
        "current_instance_group": "homogeneousCluster",
        "current_instance_group_hosts": cluster.hosts,
        "instance_groups": ["homogeneousCluster"],
        "instance_groups_dict": {group["instance_group_name"]: group},
        "distribution_instance_groups": ["homogeneousCluster"],
        "distribution_hosts": cluster.hosts,
        "is_hetero": False,
        "is_master": rank == 0,
        "master_hostname": cluster.master.host,
        "framework_module": None,
        "num_neurons": 0,
        "module_name": Path(spec.entry_point).stem,
        "network_interface_name": resources["network_interface_name"],
        "output_intermediate_dir": str(layout.output / "intermediate"),
        "is_modelparallel_enabled": False,
        "is_smddpmprun_installed": False,
        "is_smddprun_installed": False,
    }


def _env_value(value: Any) -> str:
    """A toolkit value as its SM_<NAME> variable holds it (JSON but for plain strings)."""
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value)

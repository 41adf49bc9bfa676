"""`from sagemaker_training import environment; env = environment.Environment()`: the
training toolkit's view of the job, from SM_TRAINING_ENV (and SM_USER_ARGS) as trainctl's
node sets them (trainctl.launcher.layout: sagemaker_env, toolkit_fields). Every property and
method the toolkit's Environment documents is here, a mapping of its properties as the
toolkit's is (`dict(env)`); `additional_framework_parameters` holds the instance type and
the distribution asked for (`sagemaker_distributed_dataparallel_enabled` for smdistributed's
data parallel library), as SageMaker's framework parameters do."""

import collections.abc
import json
import os

# Properties whose value SM_TRAINING_ENV holds under the same key.
_FIELDS = (
    "job_name", "hosts", "current_host", "num_gpus", "num_cpus", "model_dir", "output_dir",
    "output_data_dir", "output_intermediate_dir", "input_dir", "input_config_dir",
    "input_data_config", "resource_config", "channel_input_dirs", "hyperparameters",
    "user_entry_point", "module_dir", "module_name", "log_level", "network_interface_name",
    "additional_framework_parameters", "current_instance_type", "current_instance_group",
    "current_instance_group_hosts", "instance_groups", "instance_groups_dict",
    "distribution_instance_groups", "distribution_hosts", "is_hetero", "is_master",
    "master_hostname", "framework_module", "num_neurons", "is_modelparallel_enabled",
    "is_smddpmprun_installed", "is_smddprun_installed", "master_addr", "master_port",
)  # fmt: skip
_DEFAULTS = {
    "additional_framework_parameters": {}, "framework_module": None, "num_neurons": 0,
    "is_hetero": False, "is_modelparallel_enabled": False, "is_smddpmprun_installed": False,
    "is_smddprun_installed": False, "current_instance_group": "homogeneousCluster",
}  # fmt: skip


def _training_env():
    try:
        found = json.loads(os.environ.get("SM_TRAINING_ENV", "{}"))
    except ValueError:
        found = {}
    return found if isinstance(found, dict) else {}


def _field(name):
    def get(self):
        if name in self._env:
            return self._env[name]
        if name in _DEFAULTS:
            return _DEFAULTS[name]
        raise AttributeError(
            f"sagemaker_training.environment.Environment.{name}: SM_TRAINING_ENV has no "
            f"{name!r} (not a trainctl node's environment?)"
        )

    return property(get, doc=f"SM_TRAINING_ENV's {name!r}.")


class Environment(collections.abc.Mapping):
    """The job as the training toolkit describes it (see the module docstring). The
    constructor's arguments override what the node set, as the toolkit's do."""

    def __init__(self, resource_config=None, input_data_config=None, hyperparameters=None):
        self._env = _training_env()
        for name, value in (
            ("resource_config", resource_config),
            ("input_data_config", input_data_config),
            ("hyperparameters", hyperparameters),
        ):
            if value is not None:
                self._env[name] = value

    @property
    def current_host_rank(self):
        return self.hosts.index(self.current_host)

    @property
    def host_count(self):
        return len(self.hosts)

    @property
    def channels(self):
        return sorted(self.channel_input_dirs)

    @property
    def user_args(self):
        try:
            return list(json.loads(os.environ.get("SM_USER_ARGS", "[]")))
        except ValueError:
            return []

    @property
    def sagemaker_s3_output(self):
        """None: trainctl has no SageMaker-side S3 output location for the script."""
        return None

    @property
    def topology(self):
        return []

    # -- the toolkit's methods ----------------------------------------------------------
    def get_distribution_instance_groups_from_resource_config(self):
        return list(self.distribution_instance_groups)

    def get_current_instance_group(self):
        return self.current_instance_group

    def get_distribution_hosts(self):
        return list(self.distribution_hosts)

    def get_current_instance_group_hosts(self):
        return list(self.current_instance_group_hosts)

    def get_instance_groups(self):
        return list(self.instance_groups)

    def get_instance_groups_dict(self):
        return dict(self.instance_groups_dict)

    def get_master_hostname(self):
        return self.master_hostname

    def to_cmd_args(self):
        """The hyperparameters as the script's command line gets them (`--key value`)."""
        args = []
        for key, value in self.hyperparameters.items():
            args += [f"--{key}", value if isinstance(value, str) else json.dumps(value)]
        return args

    def to_env_vars(self):
        """The SM_* variables, as the toolkit's `to_env_vars` gives them."""
        return {k: v for k, v in os.environ.items() if k.startswith("SM_")}

    # -- a mapping of its properties, as the toolkit's MappingMixin --------------------
    def properties(self):
        return [n for n in dir(type(self)) if isinstance(getattr(type(self), n), property)]

    def __getitem__(self, key):
        if key not in self.properties():
            raise KeyError(f"Trying to access non property {key}")
        return getattr(self, key)

    def __iter__(self):
        return iter(self.properties())

    def __len__(self):
        return len(self.properties())

    def __str__(self):
        return str(dict(self))


for _name in _FIELDS:
    setattr(Environment, _name, _field(_name))
del _name

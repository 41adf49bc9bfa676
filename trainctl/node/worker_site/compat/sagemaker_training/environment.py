"""`from sagemaker_training import environment; env = environment.Environment()`: the
training toolkit's view of the job, from SM_TRAINING_ENV (and SM_USER_ARGS) as trainctl's
node sets them. The names are the toolkit's; a name it has that trainctl cannot fill is an
AttributeError saying so, never a made-up value."""

import json
import os

# The toolkit's names that trainctl's SM_TRAINING_ENV holds under the same key.
_SAME = (
    "job_name", "hosts", "current_host", "current_host_rank", "host_count", "master_addr",
    "master_port", "num_gpus", "num_cpus", "model_dir", "output_dir", "output_data_dir",
    "input_dir", "input_config_dir", "input_data_config", "resource_config",
    "channel_input_dirs", "hyperparameters", "user_entry_point", "module_dir", "log_level",
)  # fmt: skip


def _training_env() -> dict:
    try:
        found = json.loads(os.environ.get("SM_TRAINING_ENV", "{}"))
    except ValueError:
        found = {}
    return found if isinstance(found, dict) else {}


class Environment:
    """The job as the training toolkit describes it (see the module docstring)."""

    def __init__(self) -> None:
        self._env = _training_env()

    def __getattr__(self, name: str):
        if name in _SAME and name in self._env:
            return self._env[name]
        raise AttributeError(
            f"sagemaker_training.environment.Environment has no {name!r} under trainctl "
            f"(it has: {', '.join(sorted(self.properties()))})"
        )

    def properties(self) -> list:
        return [n for n in _SAME if n in self._env] + [
            "channels", "current_instance_type", "distribution_hosts", "is_master",
            "master_hostname", "module_name", "network_interface_name", "user_args",
        ]  # fmt: skip

    @property
    def channels(self) -> list:
        return sorted(self._env.get("channel_input_dirs", {}))

    @property
    def master_hostname(self) -> str:
        hosts = self._env.get("hosts") or [self._env.get("current_host", "algo-1")]
        return hosts[0]

    @property
    def is_master(self) -> bool:
        return self._env.get("current_host") == self.master_hostname

    @property
    def distribution_hosts(self) -> list:
        return list(self._env.get("hosts", []))

    @property
    def current_instance_type(self) -> str:
        return (self._env.get("resource_config") or {}).get("current_instance_type", "local")

    @property
    def network_interface_name(self) -> str:
        config = self._env.get("resource_config") or {}
        return config.get("network_interface_name") or os.environ.get(
            "SM_NETWORK_INTERFACE_NAME", "eth0"
        )

    @property
    def module_name(self) -> str:
        return os.path.splitext(os.path.basename(self._env.get("user_entry_point", "")))[0]

    @property
    def user_args(self) -> list:
        try:
            return list(json.loads(os.environ.get("SM_USER_ARGS", "[]")))
        except ValueError:
            return []

    def to_env_vars(self) -> dict:
        """The SM_* variables, as the toolkit's `to_env_vars` gives them."""
        return {k: v for k, v in os.environ.items() if k.startswith("SM_")}

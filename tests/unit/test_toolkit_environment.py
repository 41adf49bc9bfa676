"""The training toolkit's Environment as a trainctl node gives it (the stand-in in
node/worker_site/compat, over the SM_* variables of trainctl.launcher.layout): every property
and method sagemaker-training-toolkit's Environment documents, with SageMaker's values, and
SM_FRAMEWORK_PARAMS saying which distribution was asked for."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.unit.test_launcher import _cluster, _spec
from trainctl.launcher.layout import Layout, sagemaker_env
from trainctl.node.ranks import HOOK_DIR

pytestmark = pytest.mark.timeout(30)

# sagemaker-training-toolkit's Environment (src/sagemaker_training/environment.py, master of
# 2026-11): its properties, then its public methods.
TOOLKIT_PROPERTIES = (
    "additional_framework_parameters", "channel_input_dirs", "current_host",
    "current_instance_group", "current_instance_group_hosts", "current_instance_type",
    "distribution_hosts", "distribution_instance_groups", "framework_module", "hosts",
    "hyperparameters", "input_config_dir", "input_data_config", "input_dir",
    "instance_groups", "instance_groups_dict", "is_hetero", "is_master",
    "is_modelparallel_enabled", "is_smddpmprun_installed", "is_smddprun_installed", "job_name",
    "log_level", "master_hostname", "model_dir", "module_dir", "module_name",
    "network_interface_name", "num_cpus", "num_gpus", "num_neurons", "output_data_dir",
    "output_dir", "output_intermediate_dir", "resource_config", "sagemaker_s3_output",
    "topology", "user_entry_point",
)  # fmt: skip
TOOLKIT_METHODS = (
    "get_current_instance_group", "get_current_instance_group_hosts",
    "get_distribution_hosts", "get_distribution_instance_groups_from_resource_config",
    "get_instance_groups", "get_instance_groups_dict", "get_master_hostname", "to_cmd_args",
    "to_env_vars",
)  # fmt: skip


def toolkit_environment(monkeypatch, env: dict[str, str]):
    """The stand-in's Environment class, in a node's environment `env`."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    path = HOOK_DIR / "compat" / "sagemaker_training" / "environment.py"
    spec = importlib.util.spec_from_file_location("toolkit_environment_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Environment


def node_env(src: Path, tmp_path: Path, rank: int, **fields) -> dict[str, str]:
    spec = _spec(src, inputs={"train": "file:///data"}, hyperparameters={"lr": 0.1}, **fields)
    return sagemaker_env(
        spec, _cluster(root=str(tmp_path)), rank, Layout(tmp_path), num_gpus=0, num_cpus=2
    )


@pytest.mark.parametrize("rank", [0, 1])
def test_every_property_and_method_of_the_toolkits_environment(src, tmp_path, monkeypatch, rank):
    env = node_env(src, tmp_path, rank)
    toolkit = toolkit_environment(monkeypatch, env)()
    values = dict(toolkit)  # (reads every property, as the toolkit's mapping does)
    missing = [name for name in TOOLKIT_PROPERTIES if name not in values]
    assert missing == [], missing
    for name in TOOLKIT_METHODS:
        getattr(toolkit, name)()
    assert toolkit.current_host == f"algo-{rank + 1}" and toolkit.is_master is (rank == 0)
    assert toolkit.master_hostname == toolkit.get_master_hostname() == "algo-1"
    assert toolkit.hosts == toolkit.distribution_hosts == ["algo-1", "algo-2"]
    assert toolkit.instance_groups_dict["homogeneousCluster"]["hosts"] == toolkit.hosts
    assert toolkit.module_name == "train" and toolkit.to_cmd_args() == ["--lr", "0.1"]
    assert toolkit.output_intermediate_dir == str(tmp_path / "opt/ml/output/intermediate")
    assert toolkit.additional_framework_parameters == {"sagemaker_instance_type": "local"}
    assert json.loads(env["SM_FRAMEWORK_PARAMS"]) == toolkit.additional_framework_parameters
    assert env["SM_CURRENT_INSTANCE_TYPE"] == "local" and env["SM_IS_HETERO"] == "false"


@pytest.mark.parametrize(
    ("distribution", "params"),
    [
        ({"torch_distributed": {"enabled": True}}, {"sagemaker_torch_distributed_enabled": True}),
        (
            {"torch_distributed": {"enabled": True},
             "smdistributed": {"dataparallel": {"enabled": True}}},
            {"sagemaker_torch_distributed_enabled": True,
             "sagemaker_distributed_dataparallel_enabled": True,
             "sagemaker_distributed_dataparallel_custom_mpi_options": ""},
        ),
        (
            {"mpi": {"enabled": True, "custom_mpi_options": "-x FOO"}},
            {"sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 1,
             "sagemaker_mpi_custom_mpi_options": "-x FOO"},
        ),
    ],
)  # fmt: skip
def test_the_framework_parameters_say_which_distribution_was_asked_for(
    src, tmp_path, monkeypatch, distribution, params
):
    env = node_env(src, tmp_path, 0, distribution=distribution)
    toolkit = toolkit_environment(monkeypatch, env)()
    assert toolkit.additional_framework_parameters == {"sagemaker_instance_type": "local", **params}


def test_a_name_the_node_did_not_set_says_so_in_one_line(monkeypatch):
    toolkit = toolkit_environment(monkeypatch, {"SM_TRAINING_ENV": "{}"})()
    with pytest.raises(AttributeError) as raised:
        _ = toolkit.hosts
    assert "SM_TRAINING_ENV has no 'hosts'" in str(raised.value)
    assert toolkit.additional_framework_parameters == {}

"""The exact command and SM_* environment of each node: pure functions, no processes started."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from trainctl.cluster import ClusterInfo, NodeInfo, host_name
from trainctl.launcher import NodeCommand, build_node_command
from trainctl.launcher.layout import (
    Layout,
    format_hp_value,
    hyperparameter_args,
    resource_config,
    sagemaker_env,
)
from trainctl.launcher.threads import thread_env
from trainctl.spec.build import build_spec
from trainctl.spec.checks import env_suffix
from trainctl.spec.job import JobSpec

PY = "/usr/bin/python3"
TORCHRUN = {"torch_distributed": {"enabled": True}}
HPS: dict[str, Any] = {
    "batch-size": 32,
    "batch_size": 16,
    "lr": 0.1,
    "flag": True,
    "name": "x y",
    "layers": [1, 2],
}
HP_ARGV = [
    "--batch-size",
    "32",
    "--batch_size",
    "16",
    "--lr",
    "0.1",
    "--flag",
    "True",
    "--name",
    "x y",
    "--layers",
    "[1, 2]",
]


@pytest.fixture
def src(tmp_path: Path) -> Path:
    d = tmp_path / "src"
    d.mkdir()
    (d / "train.py").write_text("print('hi')\n")
    return d


def _spec(src: Path, **fields: Any) -> JobSpec:
    return build_spec(entry_point="train.py", source_dir=str(src), **fields)


def _cluster(
    addresses: tuple[str, ...] = ("127.0.0.1", "127.0.0.1"),
    *,
    root: str = "/",
    per_host: int = 2,
    network_env: dict[str, str] | None = None,
) -> ClusterInfo:
    return ClusterInfo(
        job="job-1",
        attempt=1,
        provider="local",
        instance_type="local",
        nodes=[
            NodeInfo(rank=r, host=host_name(r), address=a, root=root)
            for r, a in enumerate(addresses)
        ],
        master_port=29500,
        processes_per_host=per_host,
        network_env=network_env or {},
    )


# --- hyperparameters -------------------------------------------------------------------------


def test_hyperparameter_args_keep_keys_verbatim() -> None:
    assert hyperparameter_args(HPS) == HP_ARGV
    assert hyperparameter_args({}) == []


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("x y", "x y"),
        ("", ""),
        (8, "8"),
        (0.1, "0.1"),
        (True, "True"),
        (False, "False"),
        (None, "null"),
        ([1, 2], "[1, 2]"),
        ({"a": [1, "b"]}, '{"a": [1, "b"]}'),
    ],
)
def test_format_hp_value(value: Any, text: str) -> None:
    assert format_hp_value(value) == text


def test_env_suffix() -> None:
    assert env_suffix("batch-size") == "BATCH_SIZE"
    assert env_suffix("batch_size") == "BATCH_SIZE"
    assert env_suffix("model.lr") == "MODEL_LR"
    assert env_suffix("train") == "TRAIN"


# --- torchrun --------------------------------------------------------------------------------


@pytest.mark.parametrize("rank", [0, 1])
def test_torchrun_argv(src: Path, rank: int) -> None:
    spec = _spec(src, hyperparameters=HPS, distribution="torch_distributed")
    cmd = build_node_command(spec, _cluster(), rank, python=PY)
    assert isinstance(cmd, NodeCommand)
    assert cmd.argv == [
        PY,
        "-m",
        "trainctl.launcher.torchrun_main",
        "--nnodes",
        "2",
        "--node-rank",
        str(rank),
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        "29500",
        "--tee",  # 2 processes per host: each line tagged with its rank
        "3",
        "--max-restarts",
        "0",
        "train.py",
        *HP_ARGV,
    ]
    assert cmd.env == {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "\x1f${rank}\x1f",
    }


def test_one_process_per_host_needs_no_rank_tags(src: Path) -> None:
    spec = _spec(src, distribution="torch_distributed")
    cmd = build_node_command(spec, _cluster(per_host=1), 0, python=PY)
    assert "--tee" not in cmd.argv
    assert "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE" not in cmd.env


@pytest.mark.parametrize("distribution", ["torch_distributed", "mpi", None])
def test_script_arguments_come_before_the_hyperparameters(src: Path, distribution) -> None:
    """`trainctl submit multinode.py -- 50 10` is `python multinode.py 50 10 --key value`
    under every launcher."""
    spec = _spec(src, hyperparameters=HPS, distribution=distribution, arguments=["50", "10"])
    argv = build_node_command(spec, _cluster(), 0, python=PY).argv
    at = argv.index("train.py")
    assert argv[at:] == ["train.py", "50", "10", *HP_ARGV]


def test_torchrun_master_is_rank_0_address(src: Path) -> None:
    spec = _spec(src, distribution="torchrun")
    cluster = _cluster(("10.0.0.1", "10.0.0.2"), per_host=8)
    for rank in (0, 1):
        argv = build_node_command(spec, cluster, rank, python=PY).argv
        assert argv[argv.index("--master-addr") + 1] == "10.0.0.1"
        assert argv[argv.index("--nproc-per-node") + 1] == "8"
        assert argv[argv.index("--node-rank") + 1] == str(rank)


# --- plain python ----------------------------------------------------------------------------


@pytest.mark.parametrize("rank", [0, 1])
def test_plain_python_argv_and_env(src: Path, rank: int) -> None:
    spec = _spec(src, hyperparameters=HPS)
    assert spec.launcher == "python"
    cmd = build_node_command(spec, _cluster(), rank, python=PY)
    assert cmd.argv == [PY, "train.py", *HP_ARGV]
    assert cmd.env["RANK"] == str(rank)
    assert cmd.env["WORLD_SIZE"] == "2"  # one process per host
    assert cmd.env["LOCAL_RANK"] == "0"
    assert cmd.env["LOCAL_WORLD_SIZE"] == "1"
    assert cmd.env["MASTER_ADDR"] == "127.0.0.1"
    assert cmd.env["MASTER_PORT"] == "29500"


def test_disabled_distribution_is_plain_python(src: Path) -> None:
    spec = _spec(src, distribution={"torch_distributed": {"enabled": False}})
    assert build_node_command(spec, _cluster(), 0, python=PY).argv == [PY, "train.py"]


# --- mpi -------------------------------------------------------------------------------------


def _mpi_flag(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_mpi_rank0_shared_address(src: Path) -> None:
    spec = _spec(src, hyperparameters=HPS, distribution="mpi")
    cmd = build_node_command(spec, _cluster(), 0, python=PY)
    assert cmd.argv[0] == "mpirun"
    assert _mpi_flag(cmd.argv, "-np") == "4"
    assert _mpi_flag(cmd.argv, "--host") == "127.0.0.1:4"
    # The script and its arguments come last, after the python to run it with (the job's,
    # named in the environment), its errors with its output; each piece tagged with its rank.
    assert cmd.argv[-(len(HP_ARGV) + 5) :] == [
        "/bin/sh",
        "-c",
        'cd "$TRAINCTL_CODE_DIR" && exec "$TRAINCTL_JOB_PYTHON" "$@" 2>&1',
        "python",
        "train.py",
        *HP_ARGV,
    ]
    assert "--tag-output" in cmd.argv and cmd.mpirun_output
    for var in ("MASTER_ADDR", "MASTER_PORT"):
        i = cmd.argv.index(var)
        assert cmd.argv[i - 1] == "-x"
    assert cmd.env == {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
        "TRAINCTL_JOB_PYTHON": PY,
        "TRAINCTL_CODE_DIR": "/opt/ml/code",
    }
    # one host: no remote shell, and mpirun's own traffic stays where nothing pins it
    assert "plm_rsh_agent" not in cmd.argv and "oob_tcp_if_include" not in cmd.argv


def test_mpi_rank0_distinct_addresses(src: Path) -> None:
    """Other hosts are reached through trainctl's remote shell (each node's agent starts
    Open MPI's daemon there), run by the agent's own interpreter, from this node only; each
    host's processes start that host's own job interpreter."""
    spec = _spec(src, hyperparameters=HPS, distribution="mpi")
    cluster = _cluster(("a", "b"))
    cmd = build_node_command(spec, cluster, 0, python=PY, agent_python="/agent/python")
    argv = cmd.argv
    assert _mpi_flag(argv, "--host") == "a:2,b:2"
    assert _mpi_flag(argv, "-np") == "4"
    assert cmd.env["MASTER_ADDR"] == "a" and cmd.env["TRAINCTL_JOB_PYTHON"] == PY
    assert argv[argv.index("plm_rsh_agent") + 1] == "/agent/python -m trainctl.node.remote_start"
    assert argv[argv.index("plm_rsh_no_tree_spawn") + 1] == "1"
    assert "PATH" not in argv  # each host's own, from its agent
    program = [
        "/bin/sh",
        "-c",
        'cd "$TRAINCTL_CODE_DIR" && exec "$TRAINCTL_JOB_PYTHON" "$@" 2>&1',
        "python",
        "train.py",
    ]
    assert argv[-(len(HP_ARGV) + 5) :] == [*program, *HP_ARGV]
    # without an agent's interpreter named (a dry run), the node's python runs it
    plain = build_node_command(spec, cluster, 0, python=PY).argv
    assert plain[plain.index("plm_rsh_agent") + 1] == f"{PY} -m trainctl.node.remote_start"


def test_mpi_traffic_stays_on_the_interfaces_the_cluster_gives_nccl(src: Path) -> None:
    spec = _spec(src, distribution="mpi")
    pinned = _cluster(("127.0.0.2", "127.0.0.3"), network_env={"NCCL_SOCKET_IFNAME": "lo"})
    argv = build_node_command(spec, pinned, 0, python=PY).argv
    assert argv[argv.index("oob_tcp_if_include") + 1] == "lo"
    assert argv[argv.index("btl_tcp_if_include") + 1] == "lo"
    # EC2's exclusion (NCCL's prefixes): Open MPI's whole names, docker's bridge among them
    excluded = _cluster(("a", "b"), network_env={"NCCL_SOCKET_IFNAME": "^lo,docker"})
    argv = build_node_command(spec, excluded, 0, python=PY).argv
    assert argv[argv.index("oob_tcp_if_exclude") + 1] == "lo,docker0"
    assert argv[argv.index("btl_tcp_if_exclude") + 1] == "lo,docker0"
    assert "btl_tcp_if_include" not in argv
    # nothing given to NCCL (an SSH host's network is the user's): Open MPI's defaults
    argv = build_node_command(spec, _cluster(("a", "b")), 0, python=PY).argv
    assert not [word for word in argv if "_tcp_if_" in word]
    # the user's choice for a part wins, include or exclude (Open MPI refuses both at once)
    mine = _spec(src, distribution={"mpi": {"custom_mpi_options": "--mca btl_tcp_if_exclude eth1"}})
    argv = build_node_command(mine, excluded, 0, python=PY).argv
    assert (
        argv.count("btl_tcp_if_exclude") == 1
        and argv[argv.index("btl_tcp_if_exclude") + 1] == "eth1"
    )
    assert "btl_tcp_if_include" not in argv and "oob_tcp_if_exclude" in argv


def test_mpi_worker_ranks_run_nothing(src: Path) -> None:
    spec = _spec(src, distribution="mpi")
    for cluster in (_cluster(), _cluster(("a", "b"))):
        cmd = build_node_command(spec, cluster, 1, python=PY)
        assert cmd.argv == []


def test_mpi_processes_per_host_and_custom_options(src: Path) -> None:
    spec = _spec(
        src,
        distribution={
            "mpi": {
                "processes_per_host": 3,
                "custom_mpi_options": "-x NCCL_DEBUG=INFO --timestamp-output",
            }
        },
    )
    argv = build_node_command(spec, _cluster(("a", "b", "c")), 0, python=PY).argv
    assert _mpi_flag(argv, "-np") == "9"
    assert _mpi_flag(argv, "--host") == "a:3,b:3,c:3"
    i = argv.index("--timestamp-output")
    assert argv[i - 2 : i + 1] == ["-x", "NCCL_DEBUG=INFO", "--timestamp-output"]
    assert argv[i + 1 :] == [
        "/bin/sh",
        "-c",
        'cd "$TRAINCTL_CODE_DIR" && exec "$TRAINCTL_JOB_PYTHON" "$@" 2>&1',
        "python",
        "train.py",
    ]


def test_mpi_single_node(src: Path) -> None:
    spec = _spec(src, distribution="mpi")
    argv = build_node_command(spec, _cluster(("127.0.0.1",), per_host=1), 0, python=PY).argv
    assert _mpi_flag(argv, "--host") == "127.0.0.1:1"
    assert _mpi_flag(argv, "-np") == "1"


# --- SM_* environment ------------------------------------------------------------------------


def _env(
    spec: JobSpec, rank: int, root: Path | str, cluster: ClusterInfo | None = None
) -> dict[str, str]:
    return sagemaker_env(
        spec,
        cluster or _cluster(root=str(root)),
        rank,
        Layout(Path(root)),
        num_gpus=1,
        num_cpus=4,
        source_uri="file:///store/sources/abc/sourcedir.tar.gz",
    )


@pytest.mark.parametrize("rank", [0, 1])
def test_sagemaker_env(src: Path, tmp_path: Path, rank: int) -> None:
    root = tmp_path / f"node-{rank}"
    spec = _spec(src, hyperparameters=HPS, inputs={"train": "file:///data"})
    env = _env(spec, rank, root)
    ml = root / "opt" / "ml"

    assert json.loads(env["SM_HOSTS"]) == ["algo-1", "algo-2"]
    assert env["SM_CURRENT_HOST"] == f"algo-{rank + 1}"
    assert env["SM_CURRENT_HOST_RANK"] == str(rank)
    assert env["SM_HOST_COUNT"] == "2"
    assert env["SM_MASTER_ADDR"] == "algo-1"  # SageMaker's: the first host's name
    assert env["SM_MASTER_PORT"] == "29500"
    assert env["SM_NUM_GPUS"] == "1"
    assert env["SM_NUM_CPUS"] == "4"
    assert env["SM_MODEL_DIR"] == str(ml / "model")
    assert env["SM_OUTPUT_DIR"] == str(ml / "output")
    assert env["SM_OUTPUT_DATA_DIR"] == str(ml / "output" / "data")
    assert env["SM_INPUT_DIR"] == str(ml / "input")
    assert env["SM_INPUT_CONFIG_DIR"] == str(ml / "input" / "config")
    assert env["SM_CHANNEL_TRAIN"] == str(ml / "input" / "data" / "train")
    assert json.loads(env["SM_CHANNELS"]) == ["train"]
    assert json.loads(env["SM_HPS"]) == HPS
    assert env["SM_HP_LR"] == "0.1"
    assert env["SM_HP_FLAG"] == "True"
    assert env["SM_HP_NAME"] == "x y"
    assert env["SM_HP_LAYERS"] == "[1, 2]"
    assert env["SM_CHECKPOINT_DIR"] == str(ml / "checkpoints")
    assert env["SM_USER_ENTRY_POINT"] == "train.py"
    assert env["SM_MODULE_NAME"] == "train"
    assert env["SM_MODULE_DIR"] == "file:///store/sources/abc/sourcedir.tar.gz"
    assert json.loads(env["SM_USER_ARGS"]) == hyperparameter_args(spec.hyperparameters)
    assert json.loads(env["SM_USER_ARGS"]) == HP_ARGV
    assert json.loads(env["SM_INPUT_DATA_CONFIG"]) == {
        "train": {"TrainingInputMode": "File", "S3DistributionType": "FullyReplicated"}
    }
    assert all(isinstance(v, str) for v in env.values())

    training = json.loads(env["SM_TRAINING_ENV"])
    assert training["hosts"] == ["algo-1", "algo-2"]
    assert training["current_host"] == env["SM_CURRENT_HOST"]
    assert training["current_host_rank"] == rank
    assert training["host_count"] == 2
    assert training["master_addr"] == "algo-1"
    assert training["master_port"] == 29500
    assert training["num_gpus"] == 1
    assert training["num_cpus"] == 4
    assert training["model_dir"] == env["SM_MODEL_DIR"]
    assert training["output_dir"] == env["SM_OUTPUT_DIR"]
    assert training["output_data_dir"] == env["SM_OUTPUT_DATA_DIR"]
    assert training["input_dir"] == env["SM_INPUT_DIR"]
    assert training["input_config_dir"] == env["SM_INPUT_CONFIG_DIR"]
    assert training["channel_input_dirs"] == {"train": env["SM_CHANNEL_TRAIN"]}
    assert training["hyperparameters"] == HPS
    assert training["user_entry_point"] == "train.py"
    assert training["module_dir"] == env["SM_MODULE_DIR"]
    assert training["checkpoint_dir"] == env["SM_CHECKPOINT_DIR"]
    assert training["job_name"] == "job-1"
    assert training["resource_config"] == json.loads(env["SM_RESOURCE_CONFIG"])
    assert training["input_data_config"] == json.loads(env["SM_INPUT_DATA_CONFIG"])


def test_sm_hp_for_hyphenated_key(src: Path, tmp_path: Path) -> None:
    spec = _spec(src, hyperparameters={"batch-size": 32})
    env = _env(spec, 0, tmp_path)
    assert env["SM_HP_BATCH_SIZE"] == "32"


def test_channels_sorted_and_suffixed(src: Path, tmp_path: Path) -> None:
    spec = _spec(src, inputs={"val.v2": "file:///v", "train": "file:///t", "test-x": "s3://b-1/x"})
    env = _env(spec, 0, tmp_path)
    data = tmp_path / "opt" / "ml" / "input" / "data"
    assert json.loads(env["SM_CHANNELS"]) == ["test-x", "train", "val.v2"]
    assert env["SM_CHANNEL_VAL_V2"] == str(data / "val.v2")
    assert env["SM_CHANNEL_TEST_X"] == str(data / "test-x")
    assert env["SM_CHANNEL_TRAIN"] == str(data / "train")


def test_no_inputs_no_hyperparameters(src: Path, tmp_path: Path) -> None:
    env = _env(_spec(src), 0, tmp_path)
    assert json.loads(env["SM_CHANNELS"]) == []
    assert json.loads(env["SM_HPS"]) == {}
    assert json.loads(env["SM_USER_ARGS"]) == []
    assert not [k for k in env if k.startswith(("SM_CHANNEL_", "SM_HP_"))]


@pytest.mark.parametrize(
    ("local_path", "expected"),
    [
        (None, "ROOT/opt/ml/checkpoints"),
        ("/opt/ml/ckpt", "ROOT/opt/ml/ckpt"),
        ("/opt/ml/a/b", "ROOT/opt/ml/a/b"),  # (/opt/ml itself: the whole layout, refused)
        ("/tmp/x", "/tmp/x"),
        ("/opt/mlx", "/opt/mlx"),
    ],
)
def test_checkpoint_dir(src: Path, tmp_path: Path, local_path: str | None, expected: str) -> None:
    root = tmp_path / "node-0"
    spec = _spec(src, checkpoint_local_path=local_path)
    env = _env(spec, 0, root)
    want = expected.replace("ROOT", str(root))
    assert env["SM_CHECKPOINT_DIR"] == want
    assert Layout(root).checkpoints(spec) == Path(want)
    assert json.loads(env["SM_TRAINING_ENV"])["checkpoint_dir"] == want


def test_cloud_layout_root_slash(src: Path) -> None:
    spec = _spec(src, inputs={"train": "s3://my-bucket/train"}, checkpoint_local_path="/opt/ml/ck")
    env = _env(spec, 1, "/")
    assert env["SM_MODEL_DIR"] == "/opt/ml/model"
    assert env["SM_OUTPUT_DIR"] == "/opt/ml/output"
    assert env["SM_OUTPUT_DATA_DIR"] == "/opt/ml/output/data"
    assert env["SM_INPUT_DIR"] == "/opt/ml/input"
    assert env["SM_INPUT_CONFIG_DIR"] == "/opt/ml/input/config"
    assert env["SM_CHANNEL_TRAIN"] == "/opt/ml/input/data/train"
    assert env["SM_CHECKPOINT_DIR"] == "/opt/ml/ck"
    assert _env(_spec(src), 0, "/")["SM_CHECKPOINT_DIR"] == "/opt/ml/checkpoints"
    layout = Layout(Path("/"))
    assert str(layout.code) == "/opt/ml/code"
    assert str(layout.failure) == "/opt/ml/output/failure"
    assert [str(p) for p in layout.all_dirs(_spec(src))] == [
        "/opt/ml/code",
        "/opt/ml/input/config",
        "/opt/ml/input/data",
        "/opt/ml/model",
        "/opt/ml/output/data",
        "/opt/ml/checkpoints",
        "/opt/ml/output/tensorboard",
    ]
    assert env["TRAINCTL_TENSORBOARD_DIR"] == "/opt/ml/output/tensorboard"  # SageMaker's path
    # what the agent makes owner-only, and where the ranks register: never the machine's /
    assert str(layout.private) == "/opt/ml" and str(layout.ranks) == "/opt/ml/.trainctl/ranks"
    assert Layout(Path("/n/node-0")).private == Path("/n/node-0")


@pytest.mark.parametrize("rank", [0, 1])
def test_resource_config(rank: int) -> None:
    cluster = _cluster()
    assert resource_config(cluster, rank) == {
        "current_host": f"algo-{rank + 1}",
        "current_instance_type": "local",
        "current_group_name": "homogeneousCluster",
        "hosts": ["algo-1", "algo-2"],
        "instance_groups": [
            {
                "instance_group_name": "homogeneousCluster",
                "instance_type": "local",
                "hosts": ["algo-1", "algo-2"],
            }
        ],
        "network_interface_name": "eth0",
    }


def test_network_interface_from_provider(src: Path, tmp_path: Path) -> None:
    cluster = _cluster(root=str(tmp_path), network_env={"GLOO_SOCKET_IFNAME": "lo"})
    assert resource_config(cluster, 0)["network_interface_name"] == "lo"
    env = _env(_spec(src), 0, tmp_path, cluster)
    assert env["SM_NETWORK_INTERFACE_NAME"] == "lo"
    assert json.loads(env["SM_RESOURCE_CONFIG"])["network_interface_name"] == "lo"


def test_cluster_info_helpers() -> None:
    cluster = _cluster(("10.0.0.1", "10.0.0.2"))
    assert cluster.hosts == ["algo-1", "algo-2"]
    assert cluster.master.address == "10.0.0.1"
    assert cluster.node(1).host == "algo-2"
    assert host_name(0) == "algo-1"
    assert ClusterInfo.model_validate_json(cluster.model_dump_json()) == cluster


MPIRUN_REPORT = """MPI rank 0/2 local 0
--------------------------------------------------------------------------
Primary job  terminated normally, but 1 process returned
a non-zero exit code. Per user-direction, the job has been aborted.
--------------------------------------------------------------------------
mpirun detected that one or more processes exited with non-zero status, thus causing
the job to be terminated. The first process to do so was:

  Process name: [[5898,1],1]
  Exit code:    3
--------------------------------------------------------------------------""".splitlines()


def test_mpi_failure_reason_is_the_traceback_else_mpiruns_report() -> None:
    from trainctl.node.output import failure_from_output

    traceback = ["Traceback (most recent call last):", '  File "t.py", line 1', "KeyError: 'x'"]
    assert failure_from_output([*traceback, *MPIRUN_REPORT])[0] == "KeyError: 'x'"
    reason, detail = failure_from_output(MPIRUN_REPORT)
    assert reason == "mpirun: MPI rank 1 exited with code 3 (its error output did not arrive)"
    assert detail is not None and "-----" not in detail and "Process name" in detail


def test_a_traceback_interleaved_with_another_process_output_still_names_the_error() -> None:
    """mpirun forwards a process's stdout and stderr apart: a line printed before the error
    can land inside its traceback (seen in CI). The exception line is still the reason."""
    from trainctl.node.output import failure_from_output

    interleaved = [
        "Traceback (most recent call last):",
        "MPI rank 1/2 local 1",
        '  File "/code/allreduce.py", line 18, in <module>',
        '    raise ValueError(f"rank {rank} was told to fail")',
        "ValueError: rank 1 was told to fail",
        *MPIRUN_REPORT,
    ]
    reason, detail = failure_from_output(interleaved)
    assert reason == "ValueError: rank 1 was told to fail"
    assert detail is not None and "MPI rank 1/2" not in detail and "line 18" in detail
    chained = [
        "Traceback (most recent call last):",
        '  File "t.py", line 1',
        "KeyError: 'a'",
        "",
        "During handling of the above exception, another exception occurred:",
        "",
        "Traceback (most recent call last):",
        '  File "t.py", line 3',
        "RuntimeError: b",
    ]
    assert failure_from_output(chained)[0] == "RuntimeError: b"


def test_an_exit_without_a_traceback_is_its_exit_code_with_the_last_lines_as_context() -> None:
    """`print("step 7"); sys.exit(3)`: the reason is "exit code 3", not "step 7"."""
    from trainctl.node.agent import exit_text
    from trainctl.node.output import failure_from_output

    assert failure_from_output(["loading", "step 7"]) == (None, "loading\nstep 7")
    assert exit_text(3) == "exit code 3"
    assert exit_text(-9) == "killed by SIGKILL"
    assert exit_text(137) == "exit code 137"


def test_an_abort_in_the_process_groups_teardown_names_the_way_out() -> None:
    """torch 2.13's gloo process group aborts some runs as the process ends, after the
    training finished; all the output says is the C++ runtime's line."""
    from trainctl.node.output import failure_from_output

    lines = ["Train Epoch: 2 [512/512]\tLoss: 0.676017", TEARDOWN]
    reason, detail = failure_from_output(lines)
    assert reason is not None and reason.startswith(TEARDOWN)
    assert "trainctl.train.finish()" in reason and "\n" not in reason
    assert detail == "\n".join(lines)
    under_torchrun = ["[rank1]:" + TEARDOWN, "E1129 ... failed (exitcode: -6) local_rank: 1"]
    assert "trainctl.train.finish()" in (failure_from_output(under_torchrun)[0] or "")
    # the same with torchrun's own traceback after it (ChildFailedError): still the abort
    launcher = [
        "Traceback (most recent call last):",
        '  File "torch/distributed/run.py", line 1019, in run',
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "  exitcode  : -6 (pid: 10385)  (SIGABRT)",
    ]
    reason, detail = failure_from_output([TEARDOWN, *launcher])
    assert reason is not None and reason.startswith(TEARDOWN) and "finish()" in reason
    assert detail is not None and "ChildFailedError" in detail


TEARDOWN = "terminate called without an active exception"


# --- CPU threads per process ---------------------------------------------------------------

MPI_3 = {"mpi": {"enabled": True, "processes_per_host": 3}}


@pytest.mark.parametrize(
    ("addresses", "per_host", "distribution", "cpus", "threads"),
    [
        (("127.0.0.2", "127.0.0.3"), 1, None, 8, "4"),  # 2 local nodes share 8 cores
        (("127.0.0.2", "127.0.0.3"), 2, TORCHRUN, 8, "2"),  # 4 processes on this machine
        (("127.0.0.2", "127.0.0.3", "127.0.0.4"), 1, None, 2, "1"),  # never below 1
        (("127.0.0.2", "127.0.0.3"), 2, None, 8, "4"),  # plain python: one process a node
        (("10.0.0.1", "10.0.0.2"), 4, TORCHRUN, 8, "2"),  # EC2: only its own 4 processes
        (("10.0.0.1", "10.0.0.2"), 1, TORCHRUN, 8, None),  # alone on its machine: default
        (("127.0.0.2",), 1, TORCHRUN, 8, None),
        (("10.0.0.1", "10.0.0.1"), 1, None, 8, "4"),  # an SSH host listed twice
        (("127.0.0.1", "127.0.0.1"), 1, MPI_3, 12, "2"),  # mpirun's 3 a host
    ],
)  # fmt: skip
def test_processes_that_share_a_machine_share_its_cores(
    src: Path, addresses, per_host, distribution, cpus, threads
) -> None:
    spec = _spec(src, distribution=distribution) if distribution else _spec(src)
    cluster = _cluster(addresses, per_host=per_host)
    env = thread_env(spec, cluster, 0, cpus=cpus, inherited={})
    assert env == ({"OMP_NUM_THREADS": threads} if threads else {})


def test_a_thread_count_the_user_set_wins(src: Path) -> None:
    cluster = _cluster(("127.0.0.2", "127.0.0.3"), per_host=1)
    inherited = thread_env(_spec(src), cluster, 1, cpus=8, inherited={"OMP_NUM_THREADS": "6"})
    assert inherited == {}  # the agent's environment keeps the submitter's value
    own = _spec(src, environment={"OMP_NUM_THREADS": "3"})
    assert thread_env(own, cluster, 1, cpus=8, inherited={}) == {}  # the job's, applied last


@pytest.mark.parametrize(
    ("error", "said"),
    [
        ("RuntimeError: operator torchvision::nms does not exist",
         "torchvision does not match the installed torch (a CUDA torchvision beside a CPU"),
        ("AssertionError: Torch not compiled with CUDA enabled",
         "the script needs CUDA and this node's torch has none: run it on a GPU instance"),
        ("RuntimeError: Found no NVIDIA driver on your system. Please check that you have an "
         "NVIDIA GPU and installed a driver", "the script needs a GPU and this node has none"),
        ("KeyError: 'x'", "KeyError: 'x'"),
    ],
)  # fmt: skip
def test_an_error_whose_words_do_not_say_what_to_do_is_explained_in_one_line(error, said):
    """A CUDA torchvision beside a CPU torch, a GPU-only script on a CPU node: the reason
    says what it means and keeps the error's own words."""
    from trainctl.node.output import failure_from_output

    reason, _ = failure_from_output(["Traceback (most recent call last):", '  File "t.py"', error])
    assert reason is not None and reason.startswith(said) and error in reason
    assert "\n" not in reason

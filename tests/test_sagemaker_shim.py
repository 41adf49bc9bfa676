"""`from trainctl.sagemaker import PyTorch, TrainingInput`: SageMaker's arguments mapped,
refused in one line, or warned about in one line; channels sharded; a job run with SageMaker's
API (the notebook with one changed import runs in tests/test_container_run.py, in a real
kernel, in the containers SageMaker's local mode would use)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from tests.conftest import FIXTURES
from trainctl.errors import SpecError
from trainctl.sagemaker import PyTorch, SageMakerCompatibilityWarning, TrainingInput

SOURCE = FIXTURES / "sagemaker"
ROLE = "arn:aws:iam::111122223333:role/service-role/AmazonSageMaker-ExecutionRole"
PROFILE_ARN = "arn:aws:iam::111122223333:instance-profile/trainctl-node"


def pytorch(**kwargs) -> PyTorch:
    base = {
        "entry_point": "known_args.py",
        "source_dir": str(SOURCE),
        "framework_version": "2.5.1",
        "py_version": "py311",
        "instance_count": 2,
        "instance_type": "ml.p4d.24xlarge",
        "role": PROFILE_ARN,
    }
    return PyTorch(**{**base, **kwargs})


def spec_of(est: PyTorch):
    return est._estimator.spec


@pytest.mark.timeout(30)
def test_sagemaker_arguments_map_to_the_job(home):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing here deserves a warning
        est = pytorch(
            hyperparameters={"learning_rate": 0.1},
            output_path="s3://bucket/models",
            checkpoint_s3_uri="s3://bucket/ckpt",
            base_job_name="mnist",
            use_spot_instances=True,
            max_run=3600,
            max_wait=7200,
            metric_definitions=[{"Name": "loss", "Regex": "loss=([0-9.]+)"}],
            environment={"MODE": "x"},
            volume_size=100,
            distribution={"pytorchddp": {"enabled": True}},
            enable_network_isolation=False,  # SageMaker's defaults are accepted quietly
            input_mode="File",
        )
    spec = spec_of(est)
    assert spec.instance_type == "p4d.24xlarge" and spec.instance_count == 2
    assert spec.instance_profile == PROFILE_ARN
    assert spec.framework_version == "2.5.1" and spec.py_version == "py311"
    assert spec.use_spot_instances and spec.max_wait == 7200 and spec.max_run == 3600
    assert spec.launcher == "torchrun"
    assert spec.volume_size == 100 and spec.environment == {"MODE": "x"}
    assert est.hyperparameters() == {"learning_rate": 0.1}
    est.set_hyperparameters(batch_size=8)
    assert spec_of(est).hyperparameters == {"learning_rate": 0.1, "batch_size": 8}
    assert est.latest_training_job is None and est.model_data is None


@pytest.mark.timeout(30)
def test_local_instance_types_run_here(home):
    for itype in ("local", "local_gpu"):
        est = pytorch(instance_type=itype, framework_version=None, py_version=None, role=ROLE)
        assert spec_of(est).instance_type == "local"
        assert spec_of(est).instance_profile is None  # your machine: no profile, no warning


@pytest.mark.timeout(30)
def test_a_role_arn_is_used_as_the_instance_profile_of_its_name_with_one_warning(home):
    with pytest.warns(SageMakerCompatibilityWarning) as caught:
        est = pytorch(role=ROLE)
    assert len(caught) == 1
    assert "role: " in str(caught[0].message)
    assert "'AmazonSageMaker-ExecutionRole'" in str(caught[0].message)
    assert spec_of(est).instance_profile == "AmazonSageMaker-ExecutionRole"
    assert spec_of(pytorch(role="my-profile")).instance_profile == "my-profile"


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("kwargs", "field", "text"),
    [
        ({"instance_type": "ml.r7i.48xlarge"}, "instance_type", "has no EC2 equivalent"),
        ({"role": "not a role!"}, "role", "is neither an IAM ARN"),
        ({"keep_alive_period_in_seconds": 7200}, "keep_alive_period_in_seconds", "3600"),
        ({"input_mode": "Pipe"}, "input_mode", "File mode only"),
        ({"enable_network_isolation": True}, "enable_network_isolation", "not supported"),
        ({"volume_kms_key": "arn:aws:kms:..."}, "volume_kms_key", "not supported"),
        ({"distribution": {"smdistributed": {}}}, "distribution", "runs only on SageMaker"),
    ],
)
def test_what_trainctl_cannot_honour_is_one_line_naming_it(home, kwargs, field, text):
    with pytest.raises(SpecError) as raised:
        pytorch(**kwargs)
    assert raised.value.field == field
    assert text in str(raised.value) and "\n" not in str(raised.value)
    assert not (home / "store").exists(), "something was created"


@pytest.mark.timeout(30)
def test_keep_alive_is_a_warm_pool_as_on_sagemaker(home):
    assert spec_of(pytorch(keep_alive_period_in_seconds=1800)).keep_alive_period_in_seconds == 1800


@pytest.mark.timeout(30)
def test_training_input_distribution_is_checked(home):
    with pytest.raises(SpecError, match=r"TrainingInput\.distribution: 'Sharded' is not"):
        TrainingInput("s3://bucket/train", distribution="Sharded")
    with pytest.raises(SpecError, match=r"TrainingInput\.input_mode: not supported"):
        TrainingInput("s3://bucket/train", input_mode="Pipe")


@pytest.mark.timeout(30)
def test_accepted_arguments_without_effect_warn_once_each(home):
    with pytest.warns(SageMakerCompatibilityWarning) as caught:
        pytorch(sagemaker_session=object(), tags=[{"Key": "team", "Value": "x"}])
    messages = sorted(str(w.message).split(":")[0] for w in caught)
    assert messages == ["sagemaker_session", "tags"]
    with pytest.raises(TypeError, match="unexpected keyword argument 'no_such_argument'"):
        pytorch(no_such_argument=1)


@pytest.mark.timeout(30)
def test_dependencies_are_copied_next_to_the_source(home, tmp_path):
    lib = tmp_path / "mylib"
    lib.mkdir()
    (lib / "__init__.py").write_text("VALUE = 1\n")
    est = pytorch(dependencies=[str(lib)])
    staged = Path(spec_of(est).source_dir)
    assert (staged / "mylib" / "__init__.py").read_text() == "VALUE = 1\n"
    assert (staged / "known_args.py").exists()
    del est
    import gc

    gc.collect()
    assert not staged.exists()  # the staged copy goes with the estimator


@pytest.mark.e2e
@pytest.mark.timeout(120)
def test_fit_with_sagemaker_api_on_two_local_nodes(home, tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    for name in ("a.txt", "b.txt", "c.txt", "d.txt"):
        (data / name).write_text(name)
    est = PyTorch(
        entry_point="shard_probe.py",
        source_dir=str(SOURCE),
        role=ROLE,
        instance_count=2,
        instance_type="local",
        base_job_name="shards",
        metric_definitions=[{"Name": "shard", "Regex": r"SHARD (\d)"}],
    )
    est.fit({"train": TrainingInput(f"file://{data}", distribution="ShardedByS3Key")})
    job = est.latest_training_job
    assert job is not None and job.name.startswith("shards-")
    assert job.describe()["state"] == "Completed"
    logs = {
        rank: job.store.get_text(f"jobs/{job.name}/logs/attempt-1/node-{rank}.log")
        for rank in (0, 1)
    }
    assert "SHARD 0 a.txt,c.txt" in logs[0]
    assert "SHARD 1 b.txt,d.txt" in logs[1]
    capsys.readouterr()
    est.logs()  # SageMaker's: the latest job's logs, every node's
    printed = capsys.readouterr().out
    assert "[algo-1] SHARD 0 a.txt,c.txt" in printed
    assert "[algo-2] SHARD 1 b.txt,d.txt" in printed
    frame = est.training_job_analytics.dataframe()
    assert list(frame.columns) == ["timestamp", "metric_name", "value"]
    assert sorted(frame["value"].tolist()) == [0.0, 1.0]
    assert set(frame["metric_name"]) == {"shard"}

"""SageMaker v2 arguments that trainctl honours beyond the job fields of the same name, each
run as a user runs them (a real local job through the shim): disable_output_compression
(the model and output files as they are, model_data the prefix, as SageMaker's) and
container_log_level (SM_LOG_LEVEL and the training toolkit's log_level)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
FIXTURE = Path(__file__).parents[1] / "fixtures" / "sagemaker_args"


@pytest.mark.timeout(120)
def test_uncompressed_outputs_and_the_containers_log_level(home, capsys):
    from trainctl.sagemaker.pytorch import PyTorch

    estimator = PyTorch(
        entry_point="train.py",
        source_dir=str(FIXTURE),
        role="arn:aws:iam::111122223333:role/SageMakerRole",
        instance_type="local",
        instance_count=1,
        disable_output_compression=True,
        container_log_level=logging.DEBUG,
    )
    estimator.fit(wait=True, logs=True)
    assert "log_level=10 SM_LOG_LEVEL=10" in capsys.readouterr().out
    described = estimator.latest_training_job.describe()
    model_data = described["ModelArtifacts"]["S3ModelArtifacts"]
    assert model_data.endswith("/output/model/"), model_data
    job = estimator.latest_training_job.name
    output = home / "store" / "jobs" / job / "output"
    assert (output / "model" / "weights" / "model.json").read_text() == '{"w": [1, 2, 3]}'
    assert (output / "data" / "report.txt").read_text() == "done\n"
    assert not (output / "model.tar.gz").exists() and not (output / "output.tar.gz").exists()


@pytest.mark.timeout(180)
def test_max_retry_attempts_bounds_the_relaunches_after_lost_nodes(home):
    """max_retry_attempts=1 (SageMaker's, passed as it is): a lost node is relaunched once;
    the second loss fails the job, saying why (without it, no limit)."""
    from trainctl.estimator import Estimator

    estimator = Estimator(
        entry_point="train.py",
        source_dir=str(FIXTURE.parent / "sleeper"),
        max_retry_attempts=1,
        faults=["kill:0@1", "kill:0@1"],
    )
    job = estimator.fit(wait=False)
    job.wait(logs=False, raise_on_failure=False)
    described = job.describe()
    assert described["state"] == "Failed", described["state"]
    assert len(described["attempts"]) == 2
    assert "max_retry_attempts" in described["failure_reason"]


@pytest.mark.timeout(60)
def test_the_dry_run_takes_any_ec2_type_by_sagemakers_name_and_prices_it(
    home, tmp_path, monkeypatch
):
    """SageMaker's getting-started types (CPU ones) are EC2 types like any other: the dry run
    and the estimate take `ml.c5.2xlarge` and price it from the named table; a type without
    a listed price says so; a misspelt one is one line with the closest names."""
    import json
    import subprocess

    from tests.helpers import TRAINCTL

    for name in ("AWS_PROFILE", "AWS_DEFAULT_REGION", "AWS_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("TRAINCTL_AWS_SSH_CIDR", "203.0.113.7/32")
    monkeypatch.setenv("TRAINCTL_STORE", "s3://bucket/prefix")
    env = tmp_path / "src"
    env.mkdir()
    (env / "train.py").write_text("print('hi')\n")

    def submit(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [TRAINCTL, "submit", str(env / "train.py"), "--region", "us-east-1",
             "--instance-profile", "p", "--estimate", *args],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    # (the dry run's EC2 requests, made here: the CLI's also asks the s3:// store whether
    # the source is in it already, which has no AWS to answer in a test)
    from trainctl.provisioning import get_provider
    from trainctl.sagemaker.pytorch.estimator import instance_type_of
    from trainctl.spec.build import build_spec
    from trainctl.spec.request import CapacityRequest

    spec = build_spec(
        entry_point="train.py", source_dir=str(env), instance_count=2, region="us-east-1",
        instance_type=instance_type_of("ml.c5.2xlarge"), instance_profile="p",
    )  # fmt: skip
    planned = get_provider(spec.instance_type).dry_run(CapacityRequest.of(spec), "c5", 1)
    launch = next(r for r in planned if r["operation"] == "RunInstances")
    assert (launch["params"]["InstanceType"], launch["params"]["MinCount"]) == ("c5.2xlarge", 2)
    priced = submit("--instance-type", "ml.c5.2xlarge", "--instance-count", "2")
    assert priced.returncode == 0, priced.stderr
    assert "estimate: 2 x c5.2xlarge (on-demand): $0.68/hour" in priced.stdout
    unpriced = submit("--instance-type", "p5.4xlarge")
    assert "estimate: 1 x p5.4xlarge (on-demand): no price known" in unpriced.stdout
    typo = submit("--instance-type", "ml.m5.xlarg")
    assert typo.returncode == 2 and len(typo.stderr.strip().splitlines()) == 1
    assert "did you mean ml.m5.xlarge" in typo.stderr
    listed = subprocess.run(
        [TRAINCTL, "types", "ml.c5.2x*", "-o", "json"], capture_output=True, text=True, timeout=60
    )
    (c5,) = json.loads(listed.stdout)
    assert (c5["name"], c5["vcpus"], c5["on_demand_usd_per_hour"]) == ("c5.2xlarge", 8, 0.34)


@pytest.mark.timeout(120)
def test_container_entry_point_and_arguments_replace_python_entry_point(home, capsys):
    """SageMaker's container_entry_point and container_arguments: the node runs that command
    (a shell script here) in the code directory with the SM_* environment, in place of
    `python entry_point`; what cannot mean anything here is one line."""
    from trainctl.errors import SpecError
    from trainctl.sagemaker.pytorch import PyTorch

    def pytorch(**kwargs):
        return PyTorch(
            entry_point="train.py",
            source_dir=str(FIXTURE),
            role="arn:aws:iam::111122223333:role/SageMakerRole",
            instance_type="local",
            **kwargs,
        )

    estimator = pytorch(
        container_entry_point=["sh", "run.sh"], container_arguments=["--epochs", "2"]
    )
    estimator.fit(wait=True, logs=True)
    out = capsys.readouterr().out
    assert "[algo-1] run.sh --epochs 2 on " in out and "log_level=20" in out  # (SM_CURRENT_HOST)
    with pytest.raises(SpecError, match=r"^container_arguments: given without"):
        pytorch(container_arguments=["x"])
    with pytest.raises(SpecError, match=r"^container_entry_point: runs once per node"):
        pytorch(
            container_entry_point=["sh", "run.sh"],
            distribution={"torch_distributed": {"enabled": True}},
        )


@pytest.mark.timeout(120)
def test_code_location_holds_each_jobs_source_as_sagemakers_does(home, tmp_path):
    """SageMaker's code_location: the packaged source goes to <URI>/<job>/source/
    sourcedir.tar.gz (the nodes fetch and verify it there); two jobs share the URI."""
    import tarfile

    from trainctl.sagemaker.pytorch import PyTorch

    code = tmp_path / "code"
    names = []
    for _ in range(2):
        estimator = PyTorch(
            entry_point="train.py",
            source_dir=str(FIXTURE),
            role="arn:aws:iam::111122223333:role/SageMakerRole",
            instance_type="local",
            code_location=code.as_uri(),
        )
        estimator.fit(wait=True, logs=False)
        job = estimator.latest_training_job
        names.append(job.name)
        archive = code / job.name / "source" / "sourcedir.tar.gz"
        with tarfile.open(archive) as tar:
            assert "train.py" in tar.getnames()
        assert job.describe()["TrainingJobStatus"] == "Completed"
    assert sorted(p.name for p in code.iterdir()) == sorted(names)
    assert not (home / "store" / "sources").exists()  # not also in the store

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

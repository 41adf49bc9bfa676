"""SageMaker SDK v3's programs with only their imports changed, on a machine without a
container engine (issue 60): programs in the style of v3's distributed local training
example (a Deep Learning Container image from image_uris.retrieve, Mode.LOCAL_CONTAINER, two
instances, a script that reads /opt/ml/input/data as written) and of v3's tuning example
(an ml.m5.xlarge ModelTrainer with a DLC image, HyperparameterTuner(model_trainer=...),
tune(wait=False) and the tuning job going on after the program ends). Each runs as a user
runs it: `python program.py`, in a process of its own."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest

from tests.helpers import FIXTURES
from trainctl.errors import SpecError

pytestmark = pytest.mark.e2e
V3 = FIXTURES / "sagemaker_v3"


def run_program(*argv: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """A program as a user runs it, on a machine whose engine is turned off."""
    env = {**os.environ, "TRAINCTL_CONTAINER_ENGINE": "none", "PYTHONWARNINGS": "default"}
    done = subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, env=env, timeout=timeout
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def warned(done: subprocess.CompletedProcess[str], field: str) -> list[str]:
    return re.findall(rf"SageMakerCompatibilityWarning: {field}: (.*)", done.stderr)


@pytest.mark.timeout(240)
def test_the_distributed_local_example_runs_with_its_imports_changed(home, tmp_path):
    done = run_program(str(V3 / "distributed_local.py"), str(tmp_path / "work"), timeout=220)
    (job,) = re.findall(r"JOB (\S+) Completed", done.stdout)
    assert job.startswith("local-mode-multi-container-")
    (image,) = warned(done, "training_image")
    assert image.startswith(
        "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.0.0-cpu-py310 is "
        "SageMaker's container image and cannot be had here (container engines are turned off"
    ), image
    for rank in (0, 1):  # both containers' ranks trained on /opt/ml/input/data's files
        assert f"rank {rank}/2 epoch 3 loss" in done.stdout, done.stdout[-3000:]
    assert done.stdout.count("Test MSE:") == 2
    assert (home / "store" / "jobs" / job / "output" / "model.tar.gz").is_file()


@pytest.mark.timeout(180)
def test_the_custom_distributed_driver_example_runs_with_its_imports_changed(home, tmp_path):
    """A DistributedConfig of the program's own: its driver runs on the node with SageMaker's
    variables and paths (it asserts them), and runs the entry script itself."""
    import tarfile

    done = run_program(str(V3 / "custom_driver.py"), str(tmp_path / "work"), timeout=160)
    (job,) = re.findall(r"JOB (\S+) Completed", done.stdout)
    assert "driver: running entry_script.py" in done.stdout and "driver: done" in done.stdout
    assert "worker 1 epoch 2" in done.stdout
    (ran_here,) = warned(done, "compute.instance_type")  # SageMaker's default type
    assert ran_here.startswith("ml.m5.xlarge runs on this machine")
    with tarfile.open(home / "store" / "jobs" / job / "output" / "model.tar.gz") as tar:
        assert sorted(tar.getnames()) == ["results-0.json", "results-1.json"]


@pytest.mark.timeout(180)
def test_the_hyperparameter_example_runs_with_its_imports_changed(home, tmp_path):
    """Hyperparameters from a JSON and a YAML file reach the script as v3's drivers spell
    them (`--boolean true`, JSON lists and mappings) and typed in SM_HPS."""
    done = run_program(str(V3 / "hyperparameters.py"), str(tmp_path / "work"), timeout=160)
    assert len(re.findall(r"JOB (json|yaml) \S+ Completed", done.stdout)) == 2, done.stdout
    assert done.stdout.count("All hyperparameter validations passed!") == 2


@pytest.mark.timeout(300)
def test_the_tuning_example_runs_with_its_imports_changed_and_outlives_its_program(home, tmp_path):
    from trainctl.sagemaker.train.tuner import HyperparameterTuner

    data = tmp_path / "digits"
    data.mkdir()
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 4, 256)
    x = rng.standard_normal((256, 16)) + np.eye(4)[labels].repeat(4, axis=1) * 2
    np.savez(data / "digits.npz", x=x.astype(np.float32), y=labels)
    done = run_program(str(V3 / "tuning" / "tune.py"), str(data), timeout=120)
    (name,) = re.findall(r"TUNING (\S+)", done.stdout)
    assert name.startswith("pytorch-digits-hpo-")  # the trainer's base_job_name
    assert f"Job Name: {name}" in done.stdout and "Status: InProgress" in done.stdout
    assert "Account: 000000000000 Bucket: trainctl-local-bucket" in done.stdout
    (ran_here,) = warned(done, "compute.instance_type")
    assert ran_here.startswith("ml.m5.xlarge runs on this machine: trainctl's store")
    assert warned(done, "role") == [], done.stderr  # (it runs here: no EC2 role to want)
    # the program has ended; the tuning job goes on, and attach finds it
    tuner = HyperparameterTuner.attach(name)
    tuner.wait()
    described = tuner.describe()
    assert described.hyper_parameter_tuning_job_status == "Completed"
    assert described.training_job_status_counters.completed == 3
    config = described.hyper_parameter_tuning_job_config
    assert (config.strategy, config.training_job_early_stopping_type) == ("Random", "Auto")
    assert config.hyper_parameter_tuning_job_objective.type == "Minimize"
    best = tuner.best_training_job()
    assert best.startswith(f"{name}-") and described.best_training_job.training_job_name == best
    frame = tuner.analytics().dataframe()
    assert len(frame) == 3 and set(frame["batch-size"]) <= {32, 64, 128}
    assert frame["FinalObjectiveValue"].notna().all()
    with pytest.raises(SpecError, match="an attached tuner has none"):
        tuner.tune()


def trainer(**kwargs):
    from trainctl.sagemaker.train import Mode, ModelTrainer
    from trainctl.sagemaker.train.configs import Compute, SourceCode

    source = SourceCode(source_dir=str(V3 / "tuning"), entry_script="mnist.py")
    return ModelTrainer(
        source_code=source,
        compute=Compute(instance_type="local_cpu"),
        training_mode=Mode.LOCAL_CONTAINER,
        **kwargs,
    )


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"warm_start_config": object()}, "warm_start_config"),
        ({"autotune": True}, "autotune"),
        ({"completion_criteria_config": object()}, "completion_criteria_config"),
        ({"strategy_config": object()}, "strategy_config"),
        ({"max_runtime_in_seconds": 600}, "max_runtime_in_seconds"),
        ({"model_trainer_name": "a"}, "model_trainer_name"),
        ({"strategy": "Smart"}, "strategy"),
        ({"objective_type": "Lowest"}, "objective_type"),
        ({"early_stopping_type": "Soon"}, "early_stopping_type"),
    ],
)  # fmt: skip
def test_what_the_v3_tuner_cannot_honour_is_one_line_naming_it(home, kwargs, field):
    from trainctl.sagemaker.core.parameter import ContinuousParameter
    from trainctl.sagemaker.train.tuner import HyperparameterTuner

    with pytest.raises(SpecError) as raised:
        HyperparameterTuner(
            model_trainer=trainer(),
            objective_metric_name="loss",
            hyperparameter_ranges={"lr": ContinuousParameter(0.001, 0.1)},
            metric_definitions=[{"Name": "loss", "Regex": "loss: ([0-9.]+)"}],
            max_jobs=2,
            **kwargs,
        )
    assert raised.value.field == field and "\n" not in str(raised.value)
    assert not (home / "store").exists(), "something was created"


@pytest.mark.timeout(30)
def test_image_uris_name_sagemakers_images_and_only_pytorchs_training_ones(home):
    from trainctl.sagemaker.core import image_uris

    def uri(**kwargs) -> str:
        return image_uris.retrieve(framework="pytorch", region="eu-west-1", **kwargs)

    registry = "763104351884.dkr.ecr.eu-west-1.amazonaws.com/pytorch-training"
    assert uri(version="2.0.0", py_version="py310", instance_type="ml.m5.xlarge") == (
        f"{registry}:2.0.0-cpu-py310"
    )
    assert uri(version="2.5.1", instance_type="ml.g5.xlarge", image_scope="training") == (
        f"{registry}:2.5.1-gpu-py311"  # (py_version: the one trainctl's table has)
    )
    with pytest.raises(ValueError, match="framework 'xgboost'"):
        image_uris.retrieve(framework="xgboost", region="eu-west-1", version="1.7-1")
    with pytest.raises(ValueError, match="image_scope 'inference'"):
        uri(version="2.5.1", image_scope="inference")
    with pytest.raises(ValueError, match=r"py_version: required for PyTorch 1\.8\.0"):
        uri(version="1.8.0")


@pytest.mark.timeout(30)
def test_a_framework_image_runs_as_an_image_only_where_it_can_be_had(home, monkeypatch):
    """The reason where it cannot: the engine turned off, none running, a version trainctl
    builds no image for, no credentials for ECR's pull. (The engine's presence and AWS's
    credentials are what this machine's state decides: stood in for here.)"""
    from trainctl.image.engine import Engine
    from trainctl.sagemaker import images

    dlc = images.framework_image_of(
        "763104351884.dkr.ecr.us-west-2.amazonaws.com/pytorch-training:1.10.0-gpu-py38"
    )
    assert dlc == images.FrameworkImage("1.10.0", "py38", dlc.uri)
    assert images.framework_image_of("registry.example.com/team/trainer:1") is None
    monkeypatch.setenv("TRAINCTL_CONTAINER_ENGINE", "none")
    assert "turned off" in images.why_not_an_image(dlc)
    monkeypatch.setenv("TRAINCTL_CONTAINER_ENGINE", "")
    monkeypatch.setattr("trainctl.image.engine.find_engine", lambda: None)
    assert "no container engine" in images.why_not_an_image(dlc)
    monkeypatch.setattr("trainctl.image.engine.find_engine", lambda: Engine("podman", "/x"))
    old = images.FrameworkImage("1.5.0", "py3")
    assert "builds SageMaker's PyTorch images for 1.13.1" in images.why_not_an_image(old)
    monkeypatch.setattr(images, "_aws_credentials", lambda: False)
    assert "needs AWS credentials" in images.why_not_an_image(dlc)
    monkeypatch.setattr(images, "_aws_credentials", lambda: True)
    assert images.why_not_an_image(dlc) is None
    assert images.why_not_an_image(images.FrameworkImage("2.5.1", "py311")) is None


@pytest.mark.timeout(30)
def test_a_model_trainer_given_to_v2s_tuner_says_where_it_goes(home):
    from trainctl.sagemaker.tuner import ContinuousParameter, HyperparameterTuner

    with pytest.raises(SpecError) as raised:
        HyperparameterTuner(trainer(), "loss", {"lr": ContinuousParameter(0.001, 0.1)})
    assert raised.value.field == "estimator" and "model_trainer=" in str(raised.value)


@pytest.mark.timeout(120)
def test_a_framework_image_whose_pull_is_refused_runs_as_processes(home, tmp_path, monkeypatch):
    """Only trying tells that ECR refuses the pull: the image's build fails before anything
    of the job is made, one warning names the refusal, and the job runs as processes.
    (ECR's answer is AWS's: stood in for, with an engine and credentials said to be here.)"""
    from trainctl.image.engine import ImageBuildError
    from trainctl.sagemaker import SageMakerCompatibilityWarning, images
    from trainctl.sagemaker.pytorch import PyTorch

    monkeypatch.setattr(images, "why_not_an_image", lambda image: None)
    refused = "cannot pull 763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training: denied"

    tried = []

    def resolve_image(spec):
        tried.append(spec.framework_version)
        if spec.framework_version is not None:
            raise ImageBuildError(refused)
        return spec

    monkeypatch.setattr("trainctl.controller.submit.resolve_image", resolve_image)
    (tmp_path / "train.py").write_text("print('TRAINED as processes')\n")
    est = PyTorch(
        entry_point="train.py", source_dir=str(tmp_path), framework_version="2.5.1",
        py_version="py311", instance_type="local", instance_count=1,
    )  # fmt: skip
    with pytest.warns(SageMakerCompatibilityWarning) as caught:
        est.fit(logs=False)
    (said,) = [str(w.message) for w in caught]
    assert said.startswith("framework_version: 2.5.1 (py_version py311) is SageMaker's")
    assert f"building on it failed: {refused}" in said
    job = est.latest_training_job
    assert job.describe()["state"] == "Completed"
    assert "TRAINED as processes" in job.store.get_text(
        f"jobs/{job.name}/logs/attempt-1/node-0.log"
    )
    assert tried == ["2.5.1", None], tried  # the image first, then processes
    assert est._estimator.spec.framework_version is None

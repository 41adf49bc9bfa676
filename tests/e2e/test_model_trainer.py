"""SageMaker SDK v3's ModelTrainer, imports-only (`from trainctl.sagemaker.train import
ModelTrainer`): a program in the style of SageMaker's examples runs on 2 local nodes; every
field is honoured or refused in one line naming it; the 2.2xx import path works too."""

from __future__ import annotations

import pytest

from tests.helpers import FIXTURES
from trainctl.errors import SpecError
from trainctl.sagemaker.train import Mode, ModelTrainer
from trainctl.sagemaker.train.configs import (
    CheckpointConfig,
    Compute,
    InputData,
    MetricDefinition,
    Networking,
    OutputDataConfig,
    RetryStrategy,
    SourceCode,
    StoppingCondition,
    Tag,
)
from trainctl.sagemaker.train.distributed import SMP, Torchrun

SOURCE = SourceCode(source_dir=str(FIXTURES / "model_trainer"), entry_script="train.py")


def _spec(trainer: ModelTrainer):
    return trainer._estimator().spec


@pytest.mark.e2e
@pytest.mark.timeout(180)
def test_a_model_trainer_program_runs_with_only_its_imports_changed(home, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for name in ("a.csv", "b.csv"):
        (data / name).write_text("1,2\n")
    trainer = ModelTrainer(
        training_mode=Mode.LOCAL_CONTAINER,
        source_code=SOURCE,
        compute=Compute(instance_type="ml.c5.xlarge", instance_count=2),
        distributed=Torchrun(),
        stopping_condition=StoppingCondition(max_runtime_in_seconds=600),
        hyperparameters={"epochs": 2, "lr": 0.05},
        environment={"MODE": "v3"},
        base_job_name="v3-trainer",
    ).with_metric_definitions([MetricDefinition(name="total", regex=r"total=([0-9.]+)")])
    trainer.train(input_data_config=[InputData(channel_name="train", data_source=str(data))])
    job = trainer._latest_training_job
    assert job.training_job_status == "Completed", job.failure_reason
    assert job.training_job_name.startswith("v3-trainer-")
    assert job.model_artifacts.s3_model_artifacts.endswith("/output/model.tar.gz")
    logs = "".join(
        job.job.store.get_text(f"jobs/{job.training_job_name}/logs/attempt-1/node-{rank}.log")
        for rank in (0, 1)
    )
    for rank in (0, 1):
        assert (
            f"TRAINER rank={rank} world=2 epochs=2 lr=0.05 files=a.csv,b.csv total=4 spot=v3"
        ) in logs, logs
    described = job.job.describe()
    assert described["instance_type"] == "local" and described["metrics"]["total"] == 4.0


@pytest.mark.timeout(30)
def test_the_trainers_fields_map_to_the_job(home, tmp_path):
    hps = tmp_path / "hps.yaml"
    hps.write_text("epochs: 3\nlr: 0.1\n")
    trainer = ModelTrainer(
        source_code=SourceCode(
            source_dir=str(FIXTURES / "model_trainer"), command="python train.py --extra 1"
        ),
        compute=Compute(
            instance_type="ml.p4d.24xlarge",
            instance_count=4,
            enable_managed_spot_training=True,
            keep_alive_period_in_seconds=600,
            volume_size_in_gb=200,
        ),
        distributed=Torchrun(process_count_per_node=8),
        stopping_condition=StoppingCondition(
            max_runtime_in_seconds=3600, max_wait_time_in_seconds=7200
        ),
        output_data_config=OutputDataConfig(s3_output_path="s3://bucket/out"),
        checkpoint_config=CheckpointConfig(s3_uri="s3://bucket/ckpt"),
        networking=Networking(subnets=["subnet-0abc1234"], security_group_ids=["sg-0abc1234"]),
        hyperparameters=str(hps),
        role="arn:aws:iam::111122223333:instance-profile/trainctl-node",
    ).with_retry_strategy(RetryStrategy(maximum_retry_attempts=2))
    spec = _spec(trainer)
    assert (spec.instance_type, spec.instance_count, spec.processes_per_host) == (
        "p4d.24xlarge", 4, 8,
    )  # fmt: skip
    assert spec.use_spot_instances and spec.keep_alive_period_in_seconds == 600
    assert spec.volume_size == 200 and spec.max_run == 3600 and spec.max_wait == 7200
    assert spec.launcher == "torchrun" and spec.max_retry_attempts == 2  # SageMaker's meaning
    assert (spec.entry_point, spec.arguments) == ("train.py", ["--extra", "1"])
    assert spec.hyperparameters == {"epochs": 3, "lr": 0.1}  # from the YAML file
    assert spec.output_path == "s3://bucket/out" and spec.checkpoint_s3_uri == "s3://bucket/ckpt"
    assert spec.subnets == ["subnet-0abc1234"] and spec.security_group_ids == ["sg-0abc1234"]
    assert spec.instance_profile == "arn:aws:iam::111122223333:instance-profile/trainctl-node"


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"compute": Compute(instance_type="ml.p3.2xlarge", training_plan_arn="arn:x")},
         "compute.training_plan_arn"),
        ({"distributed": Torchrun(smp=SMP(tensor_parallel_degree=2))}, "distributed.smp"),
        ({"networking": Networking(enable_network_isolation=True)},
         "networking.enable_network_isolation"),
        ({"output_data_config": OutputDataConfig(compression_type="ZSTD")},
         "output_data_config.compression_type"),
        ({"algorithm_name": "xgboost"}, "algorithm_name"),
        ({"source_code": SourceCode(source_dir=".", command="bash run.sh")},
         "source_code.command"),
        ({"training_mode": "SOMEWHERE"}, "training_mode"),
        ({"compute": Compute(instance_type="ml.r7i.48xlarg")}, "instance_type"),
    ],
)  # fmt: skip
def test_what_trainctl_cannot_honour_is_one_line_naming_the_field(home, kwargs, field):
    base = {"source_code": SOURCE, "compute": Compute(instance_type="ml.p3.2xlarge")}
    with pytest.raises(SpecError) as raised:
        ModelTrainer(**{**base, **kwargs})
    assert raised.value.field == field, raised.value
    assert "\n" not in str(raised.value)
    assert not (home / "store").exists(), "something was created"


@pytest.mark.timeout(30)
def test_builders_and_the_2_2xx_import_path(home):
    from trainctl.sagemaker.modules.configs import SourceCode as Old
    from trainctl.sagemaker.modules.train import ModelTrainer as OldTrainer

    assert OldTrainer is ModelTrainer and Old is SourceCode
    from trainctl.sagemaker.core.helper.session_helper import Session, get_execution_role

    assert Session().default_bucket() and get_execution_role()
    trainer = ModelTrainer(source_code=SOURCE, compute=Compute(instance_type="ml.p3.2xlarge"))
    # (what each builder sets: tests/e2e/test_tensorboard.py, test_sagemaker_args.py)
    assert trainer.with_tensorboard_output_config() is trainer
    trainer = ModelTrainer(
        source_code=SOURCE,
        compute=Compute(instance_type="ml.p3.2xlarge", volume_kms_key_id="alias/train"),
        output_data_config=OutputDataConfig(compression_type="NONE", kms_key_id="alias/out"),
        tags=[Tag(key="team", value="vision")],
    )
    spec = trainer._estimator().spec
    assert spec.volume_kms_key == "alias/train" and spec.disable_output_compression
    assert spec.output_kms_key == "alias/out"
    assert spec.tags == {"team": "vision"}
    with pytest.raises(SpecError, match=r"^from_recipe: not supported by trainctl: "):
        trainer.from_recipe  # noqa: B018
    assert trainer.with_infra_check_config() is trainer  # the node checks run always
    with pytest.raises(TypeError):
        ModelTrainer(source_code=SOURCE, instance_typ="x")  # not SageMaker's: a TypeError
    with pytest.raises(Exception, match="extra"):
        Compute(instance_typ="ml.p3.2xlarge")  # a config's misspelt field, as SageMaker's

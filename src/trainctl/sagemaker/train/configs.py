"""`sagemaker.train.configs` (SageMaker Python SDK v3; `sagemaker.modules.configs` in
2.2xx): the configuration objects a ModelTrainer takes, with SageMaker's field names. They
only carry values: what each means here is ModelTrainer's to say (trainctl.sagemaker.train.
model_trainer), a field trainctl cannot honour refused in one line there."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

__all__ = [
    "CheckpointConfig",
    "Compute",
    "FileSystemDataSource",
    "InfraCheckConfig",
    "InputData",
    "MetricDefinition",
    "Networking",
    "OutputDataConfig",
    "RetryStrategy",
    "S3DataSource",
    "SourceCode",
    "StoppingCondition",
    "Tag",
    "TensorBoardOutputConfig",
]


class _Config(BaseModel):
    # extra="forbid", as SageMaker's: a misspelt field is an error naming it
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class SourceCode(_Config):
    source_dir: str | None = None
    requirements: str | None = None  # a requirements file inside source_dir
    entry_script: str | None = None
    command: str | None = None  # "python train.py --epochs 3"
    ignore_patterns: list[str] | None = None


class Compute(_Config):
    instance_type: str | None = None
    instance_count: int | None = None
    volume_size_in_gb: int | None = 30
    volume_kms_key_id: str | None = None
    keep_alive_period_in_seconds: int | None = None
    instance_groups: list[Any] | None = None
    training_plan_arn: str | None = None
    enable_managed_spot_training: bool | None = None


class StoppingCondition(_Config):
    max_runtime_in_seconds: int | None = None
    max_pending_time_in_seconds: int | None = None
    max_wait_time_in_seconds: int | None = None


class Networking(_Config):
    security_group_ids: list[str] | None = None
    subnets: list[str] | None = None
    enable_network_isolation: bool | None = None
    enable_inter_container_traffic_encryption: bool | None = None


class S3DataSource(_Config):
    s3_uri: str
    s3_data_type: str | None = "S3Prefix"
    s3_data_distribution_type: str | None = None  # FullyReplicated | ShardedByS3Key
    attribute_names: list[str] | None = None
    instance_group_names: list[str] | None = None


class FileSystemDataSource(_Config):
    file_system_id: str
    file_system_access_mode: str
    file_system_type: str
    directory_path: str


class InputData(_Config):
    channel_name: str
    data_source: str | S3DataSource | FileSystemDataSource
    content_type: str | None = None


class OutputDataConfig(_Config):
    s3_output_path: str | None = None
    kms_key_id: str | None = None
    compression_type: str | None = None  # GZIP (the default) | NONE


class CheckpointConfig(_Config):
    s3_uri: str | None = None
    local_path: str | None = "/opt/ml/checkpoints"


class TensorBoardOutputConfig(_Config):
    s3_output_path: str | None = None
    local_path: str | None = "/opt/ml/output/tensorboard"


class RetryStrategy(_Config):
    maximum_retry_attempts: int


class InfraCheckConfig(_Config):
    enable_infra_check: bool | None = None


class MetricDefinition(_Config):
    name: str
    regex: str


class Tag(_Config):
    key: str
    value: str

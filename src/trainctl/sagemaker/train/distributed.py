"""`sagemaker.train.distributed`: how a ModelTrainer's job launches its processes. Torchrun
is trainctl's torchrun launcher, MPI its Open MPI launcher, a DistributedConfig of one's own
a driver script each node runs; SageMaker's model parallel library (`smp`) runs only on
SageMaker and is refused when given."""

from __future__ import annotations

from typing import Any

from trainctl.sagemaker.train.configs import _Config

__all__ = ["MPI", "SMP", "DistributedConfig", "Torchrun"]


class DistributedConfig(_Config):
    """SageMaker's base of a launch. A subclass of one's own that names a driver (the
    properties `driver_dir`, a folder, and `driver_script`, a file in it) has each node run
    that driver in place of the entry script, as SageMaker's custom drivers do (see
    model_trainer)."""

    process_count_per_node: int | None = None

    @property
    def driver_dir(self) -> str | None:
        return None

    @property
    def driver_script(self) -> str | None:
        return None


class SMP(_Config):
    hybrid_shard_degree: int | None = None
    sm_activation_offloading: bool | None = None
    activation_loading_horizon: int | None = None
    fsdp_cache_flush_warnings: bool | None = None
    allow_empty_shards: bool | None = None
    tensor_parallel_degree: int | None = None
    context_parallel_degree: int | None = None
    expert_parallel_degree: int | None = None
    random_seed: int | None = None


class Torchrun(DistributedConfig):
    smp: SMP | None = None


class MPI(DistributedConfig):
    mpi_additional_options: list[str] | None = None

    def options(self) -> dict[str, Any]:
        """SageMaker v2's `distribution={"mpi": ...}` of the same launch."""
        out: dict[str, Any] = {"enabled": True}
        if self.process_count_per_node:
            out["processes_per_host"] = self.process_count_per_node
        if self.mpi_additional_options:
            out["custom_mpi_options"] = " ".join(self.mpi_additional_options)
        return out

"""The data-parallel library's older module API (`import
smdistributed.dataparallel.torch.distributed as dist`), as torch.distributed: the process
group is torchrun's (NCCL with CUDA, else gloo), the local rank and size torchrun's."""

import os

import torch.distributed as _dist

from smdistributed.dataparallel.torch.torch_smddp import backend_for_smddp

ReduceOp = _dist.ReduceOp
group = _dist.group
all_reduce = _dist.all_reduce
all_gather = _dist.all_gather
broadcast = _dist.broadcast
reduce = _dist.reduce
barrier = _dist.barrier
get_rank = _dist.get_rank
get_world_size = _dist.get_world_size
is_initialized = _dist.is_initialized


def is_available() -> bool:
    return _dist.is_available()


def init_process_group(*args, **kwargs) -> None:
    """Join the job's process group once (its arguments, SageMaker's too, are not needed:
    torchrun's environment says where the others are)."""
    if not _dist.is_initialized():
        _dist.init_process_group(backend=backend_for_smddp())


def get_local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def get_local_size() -> int:
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def get_node_rank() -> int:
    return int(os.environ.get("GROUP_RANK", os.environ.get("SM_CURRENT_HOST_RANK", "0")))

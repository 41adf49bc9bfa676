"""`import smdistributed.dataparallel.torch.torch_smddp` makes `smddp` a backend name of
`torch.distributed.init_process_group`, as SageMaker's library does. Here it means NCCL where
CUDA is, gloo where it is not: SageMaker's AllReduce algorithm is its own, the result of the
collectives is the same."""

import torch
import torch.distributed as _dist
import torch.distributed.distributed_c10d as _c10d

SMDDP = "smddp"


def backend_for_smddp() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


def _accepting_smddp(original):
    if getattr(original, "_accepts_smddp", False):
        return original

    def init_process_group(*args, **kwargs):
        if args and isinstance(args[0], str) and args[0].lower() == SMDDP:
            args = (backend_for_smddp(), *args[1:])
        if isinstance(kwargs.get("backend"), str) and kwargs["backend"].lower() == SMDDP:
            kwargs["backend"] = backend_for_smddp()
        return original(*args, **kwargs)

    init_process_group.__doc__ = original.__doc__
    init_process_group.__wrapped__ = original
    init_process_group._accepts_smddp = True
    return init_process_group


_dist.init_process_group = _accepting_smddp(_dist.init_process_group)
_c10d.init_process_group = _accepting_smddp(_c10d.init_process_group)

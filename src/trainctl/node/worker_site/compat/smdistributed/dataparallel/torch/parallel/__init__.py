"""`smdistributed.dataparallel.torch.parallel`: its DistributedDataParallel (see distributed)."""

from smdistributed.dataparallel.torch.parallel.distributed import DistributedDataParallel

__all__ = ["DistributedDataParallel"]

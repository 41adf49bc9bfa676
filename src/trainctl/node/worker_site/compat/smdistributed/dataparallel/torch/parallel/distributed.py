"""The older API's DistributedDataParallel: torch's, over the job's process group."""

from torch.nn.parallel import DistributedDataParallel

__all__ = ["DistributedDataParallel"]

"""A DistributedSampler that can resume in the middle of an epoch.

    sampler = ResumableDistributedSampler(train_set, seed=seed)
    loader = DataLoader(train_set, batch_size=bs, sampler=sampler)
    ckpt.restore(model=model, optimizer=opt, sampler=sampler)   # epoch and position
    for epoch in range(start_epoch, epochs):
        sampler.set_epoch(epoch)          # keeps the position if this is the resumed epoch
        for xb, yb in loader:
            ...                           # forward, backward, optimizer.step()
            sampler.advance(len(yb))      # this rank's samples now consumed

The order of indices is exactly torch.utils.data.DistributedSampler's (same permutation
from `torch.Generator().manual_seed(seed + epoch)`, same padding or dropping, same
`rank::num_replicas` subsampling). On top of that it remembers how many of this rank's
samples of the current epoch were consumed. The training loop says so with `advance()`
after each optimizer step: the DataLoader prefetches, so the sampler cannot count by itself.
`state_dict()` captures (epoch, consumed, seed); after `load_state_dict()` the next pass over
that epoch skips the consumed indices and yields exactly the rest.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sized
from typing import Any

__all__ = ["ResumableDistributedSampler"]


class ResumableDistributedSampler:
    """torch's DistributedSampler plus exact mid-epoch resume (see the module docstring).

    `dataset_or_len` is a sized data set or its length. `num_replicas` and `rank` default to
    the process group's (or WORLD_SIZE/RANK, or 1/0). Iterating yields the indices of the
    current epoch not yet consumed; `len()` is their count. After a resumed epoch is fully
    consumed, `set_epoch(e + 1)` starts the next one from the beginning. Call `set_epoch`
    at the start of every epoch (with `advance()` in use, an epoch whose samples have all
    been consumed yields nothing until the epoch changes).
    """

    def __init__(
        self,
        dataset_or_len: Sized | int,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        from trainctl.train.context import _dist_ready

        dist = _dist_ready()
        if num_replicas is None:
            num_replicas = dist.get_world_size() if dist else int(os.environ.get("WORLD_SIZE") or 1)
        if rank is None:
            rank = dist.get_rank() if dist else int(os.environ.get("RANK") or 0)
        if num_replicas < 1:
            raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"Invalid rank {rank}, rank should be in [0, {num_replicas - 1}]")
        length = dataset_or_len if isinstance(dataset_or_len, int) else len(dataset_or_len)
        if length < 0:
            raise ValueError(f"data set length must be >= 0, got {length}")
        self.length = length
        self.num_replicas = num_replicas
        self.rank = rank
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0
        self.consumed = 0
        if drop_last and length % num_replicas != 0:
            self.num_samples = math.ceil((length - num_replicas) / num_replicas)
        else:
            self.num_samples = math.ceil(length / num_replicas)
        self.total_size = self.num_samples * num_replicas

    # ------------------------------------------------------------------ torch's order

    def epoch_indices(self, epoch: int | None = None) -> list[int]:
        """All of this rank's indices for `epoch` (default: the current one), none skipped."""
        import torch

        epoch = self.epoch if epoch is None else epoch
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + epoch)
            indices = torch.randperm(self.length, generator=g).tolist()
        else:
            indices = list(range(self.length))
        if not self.drop_last:
            padding = self.total_size - len(indices)
            if padding > 0 and indices:
                if padding <= len(indices):
                    indices += indices[:padding]
                else:
                    indices += (indices * math.ceil(padding / len(indices)))[:padding]
        else:
            indices = indices[: self.total_size]
        return indices[self.rank : self.total_size : self.num_replicas]

    def __iter__(self) -> Iterator[int]:
        return iter(self.epoch_indices()[self.consumed :])

    def __len__(self) -> int:
        return self.num_samples - self.consumed

    # ------------------------------------------------------------------ position

    def set_epoch(self, epoch: int) -> None:
        """Start `epoch`; the position is kept only if `epoch` is the current (resumed) one."""
        if epoch != self.epoch:
            self.consumed = 0
        self.epoch = epoch

    def advance(self, num_samples: int) -> None:
        """Record that this rank consumed `num_samples` more samples of the current epoch."""
        if num_samples < 0:
            raise ValueError(f"num_samples must be >= 0, got {num_samples}")
        if self.consumed + num_samples > self.num_samples:
            raise ValueError(
                f"advance({num_samples}) past the end of epoch {self.epoch}: "
                f"{self.consumed} of {self.num_samples} samples already consumed"
            )
        self.consumed += num_samples

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "consumed": self.consumed, "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at (epoch, consumed); the saved seed replaces the constructor's."""
        consumed = int(state.get("consumed", 0))
        if not 0 <= consumed <= self.num_samples:
            raise ValueError(
                f"cannot resume at {consumed} consumed samples: this rank has "
                f"{self.num_samples} per epoch"
            )
        self.epoch = int(state.get("epoch", 0))
        self.seed = int(state.get("seed", self.seed))
        self.consumed = consumed

    def __repr__(self) -> str:
        return (
            f"ResumableDistributedSampler(len={self.length}, rank={self.rank}/"
            f"{self.num_replicas}, epoch={self.epoch}, consumed={self.consumed}/"
            f"{self.num_samples}, seed={self.seed}, shuffle={self.shuffle})"
        )

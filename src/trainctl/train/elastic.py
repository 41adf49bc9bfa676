"""Training that does not change when the number of workers does: a fixed *global* batch,
split over whatever world size there is, with gradient accumulation when a worker's share
does not fit (Determined's "aggregation frequency"), and a position counted in global
samples so a resume on another world size continues with the very next sample.

    sampler = GlobalBatchSampler(len(train_set), global_batch_size=256, max_per_worker=32,
                                 seed=0)
    ckpt.restore(model=model, optimizer=opt, sampler=sampler)   # epoch and global position
    for epoch in range(sampler.epoch, epochs):
        sampler.set_epoch(epoch)
        for step in sampler:                      # one optimizer step per global batch
            for micro in step.micro_batches:      # this worker's share, in pieces
                with ddp.no_sync() if not micro.last else contextlib.nullcontext():
                    x, y = train_set[micro.indices]
                    (loss_fn(model(x), y) * micro.loss_scale).backward()
            opt.step(); opt.zero_grad()
            sampler.advance(step)                 # the global batch is consumed

How a global batch is split: the epoch's permutation (torch's, from seed + epoch, as
DistributedSampler's) is cut into global batches of `global_batch_size` in order; global
batch k is split into contiguous, near-equal shares by rank (shares differ by at most one
sample), and each share into `accum` near-equal micro-batches of at most `max_per_worker`.
Every sample of the epoch is used exactly once, at any sequence of world sizes, as long as
each global batch has at least one sample per worker: a final partial batch smaller than
the world size is dropped (at most world_size - 1 samples an epoch).

`micro.loss_scale` makes the summed gradient the mean over the global batch whatever the
split: with a per-micro-batch *mean* loss, scale = len(micro) * world_size / global, since
DDP averages gradients over the world.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sized
from dataclasses import dataclass
from typing import Any

from trainctl.train.scaling import per_worker_batch

__all__ = ["GlobalBatchSampler", "MicroBatch", "Step"]


@dataclass(frozen=True)
class MicroBatch:
    indices: list[int]
    loss_scale: float
    last: bool  # the step's last micro-batch on this worker: let DDP all-reduce here


@dataclass(frozen=True)
class Step:
    number: int  # global batch number within the epoch (0-based)
    global_size: int  # samples in this global batch, all workers together
    micro_batches: list[MicroBatch]


def _split(n: int, parts: int) -> list[tuple[int, int]]:
    """n items in `parts` contiguous near-equal (start, end) pieces, the larger first."""
    base, extra = divmod(n, parts)
    out, start = [], 0
    for i in range(parts):
        end = start + base + (1 if i < extra else 0)
        out.append((start, end))
        start = end
    return out


class GlobalBatchSampler:
    """See the module docstring. `num_replicas`/`rank` default to the process group's (or
    WORLD_SIZE/RANK)."""

    def __init__(
        self,
        dataset_or_len: Sized | int,
        global_batch_size: int,
        *,
        max_per_worker: int | None = None,
        seed: int = 0,
        shuffle: bool = True,
        num_replicas: int | None = None,
        rank: int | None = None,
    ) -> None:
        from trainctl.train.context import _dist_ready

        dist = _dist_ready()
        if num_replicas is None:
            num_replicas = dist.get_world_size() if dist else int(os.environ.get("WORLD_SIZE") or 1)
        if rank is None:
            rank = dist.get_rank() if dist else int(os.environ.get("RANK") or 0)
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is not in [0, {num_replicas - 1}]")
        self.length = dataset_or_len if isinstance(dataset_or_len, int) else len(dataset_or_len)
        self.max_per_worker = max_per_worker
        self.seed, self.shuffle = seed, shuffle
        self.num_replicas, self.rank = num_replicas, rank
        self.set_global_batch_size(global_batch_size)
        self.epoch = 0
        self.position = 0  # global samples of the current epoch consumed

    def set_global_batch_size(self, global_batch_size: int, *, min_accum: int = 1) -> None:
        """Use global batches of `global_batch_size` from the next step on (the position,
        counted in samples, is unaffected: an adaptive batch size changes it between steps).
        `min_accum`: split each worker's share into at least this many micro-batches."""
        if int(global_batch_size) != global_batch_size or global_batch_size < self.num_replicas:
            raise ValueError(
                f"global_batch_size must be an integer of at least the world size "
                f"({self.num_replicas}), got {global_batch_size!r}"
            )
        self.global_batch_size = int(global_batch_size)
        share = math.ceil(self.global_batch_size / self.num_replicas)
        accum = 1 if self.max_per_worker is None else math.ceil(share / self.max_per_worker)
        if self.max_per_worker is not None and self.global_batch_size % self.num_replicas == 0:
            # the fewest accumulation steps that split a share evenly (scaling's rule)
            _, accum = per_worker_batch(
                self.global_batch_size, self.num_replicas, self.max_per_worker
            )
        self.accum = min(max(accum, min_accum), share)

    # -- the epoch's order ---------------------------------------------------------------
    def permutation(self, epoch: int | None = None) -> list[int]:
        import torch

        epoch = self.epoch if epoch is None else epoch
        if not self.shuffle:
            return list(range(self.length))
        g = torch.Generator()
        g.manual_seed(self.seed + epoch)
        return torch.randperm(self.length, generator=g).tolist()

    @property
    def usable(self) -> int:
        """Samples of an epoch that are used: a last partial global batch smaller than the
        world size is dropped."""
        tail = self.length % self.global_batch_size
        return self.length - tail if 0 < tail < self.num_replicas else self.length

    def steps_per_epoch(self) -> int:
        return math.ceil(self.usable / self.global_batch_size)

    def __len__(self) -> int:
        """Optimizer steps left in the current epoch."""
        return math.ceil(max(0, self.usable - self.position) / self.global_batch_size)

    def __iter__(self) -> Iterator[Step]:
        order = self.permutation()
        position = self.position
        while position < self.usable:
            batch = order[position : min(position + self.global_batch_size, self.usable)]
            yield self._step(position // self.global_batch_size, batch)
            position += len(batch)

    def _step(self, number: int, batch: list[int]) -> Step:
        start, end = _split(len(batch), self.num_replicas)[self.rank]
        share = batch[start:end]
        pieces = [p for p in _split(len(share), min(self.accum, len(share))) if p[1] > p[0]]
        micro = [
            MicroBatch(
                share[a:b],
                loss_scale=(b - a) * self.num_replicas / len(batch),
                last=i == len(pieces) - 1,
            )
            for i, (a, b) in enumerate(pieces)
        ]
        return Step(number, len(batch), micro)

    # -- position -------------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Start `epoch`; the position is kept only when it is the current (resumed) one."""
        if epoch != self.epoch:
            self.position = 0
        self.epoch = epoch

    def advance(self, step: Step | int) -> None:
        """After each optimizer step: its global batch is consumed (every worker calls it)."""
        size = step.global_size if isinstance(step, Step) else int(step)
        self.position += size
        if self.position > self.length:
            raise ValueError(f"advanced past the end of epoch {self.epoch}")

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.seed,
            "global_batch_size": self.global_batch_size,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at (epoch, global position), whatever world size saved it. A different
        global batch size is refused: the steps would no longer be the same."""
        saved = int(state.get("global_batch_size", self.global_batch_size))
        if saved != self.global_batch_size:
            raise ValueError(
                f"the checkpoint was trained with global_batch_size {saved}, not "
                f"{self.global_batch_size}"
            )
        position = int(state.get("position", 0))
        if not 0 <= position <= self.length:
            raise ValueError(f"cannot resume at position {position} of {self.length}")
        self.epoch = int(state.get("epoch", 0))
        self.seed = int(state.get("seed", self.seed))
        self.position = position

    def __repr__(self) -> str:
        return (
            f"GlobalBatchSampler(len={self.length}, global_batch_size={self.global_batch_size}"
            f", rank={self.rank}/{self.num_replicas}, accum={self.accum}, epoch={self.epoch}, "
            f"position={self.position})"
        )

"""Large-batch helpers: split a global batch, scale the learning rate, warm it up.

    per_worker, accum = per_worker_batch(1024, ctx.world_size, max_per_worker=64)
    lr = scaled_lr(0.1, global_batch_size=1024, base_batch_size=256)     # 0.4
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    sched = linear_warmup_scheduler(opt, warmup_steps=500)   # step() after each update

Following Goyal et al., "Accurate, Large Minibatch SGD" (and Determined's guides on
effective batch size): keep the *global* batch size a hyperparameter, derive each worker's
batch (and gradient-accumulation steps when it does not fit), multiply the learning rate by
global / base batch size, and ramp it up linearly over the first steps.
"""

from __future__ import annotations

from typing import Any

__all__ = ["linear_warmup_scheduler", "per_worker_batch", "scaled_lr", "warmup_lr"]


def per_worker_batch(
    global_batch_size: int, world_size: int, max_per_worker: int | None = None
) -> tuple[int, int]:
    """(per-worker batch, accumulation steps) with global = per_worker * world * accum.

    Without `max_per_worker` there is no accumulation. With it, the fewest accumulation
    steps whose per-worker batch fits. Raises ValueError when the global batch does not
    split evenly over the workers.
    """
    for name, value in (("global_batch_size", global_batch_size), ("world_size", world_size)):
        if int(value) != value or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if max_per_worker is not None and (int(max_per_worker) != max_per_worker or max_per_worker < 1):
        raise ValueError(f"max_per_worker must be a positive integer, got {max_per_worker!r}")
    if global_batch_size % world_size:
        raise ValueError(
            f"global batch size {global_batch_size} is not divisible by the world size "
            f"{world_size}: choose a multiple of {world_size} (e.g. "
            f"{global_batch_size - global_batch_size % world_size} or "
            f"{global_batch_size + world_size - global_batch_size % world_size})"
        )
    per_rank = global_batch_size // world_size
    if max_per_worker is None or per_rank <= max_per_worker:
        return per_rank, 1
    for accum in range(-(-per_rank // max_per_worker), per_rank + 1):
        if per_rank % accum == 0:
            return per_rank // accum, accum
    raise AssertionError("unreachable: accum == per_rank always divides")


def scaled_lr(base_lr: float, global_batch_size: int, base_batch_size: int) -> float:
    """Linear scaling rule: base_lr * global_batch_size / base_batch_size."""
    if base_batch_size <= 0 or global_batch_size <= 0:
        raise ValueError("batch sizes must be positive")
    return base_lr * global_batch_size / base_batch_size


def _warmup_factor(step: int, warmup_steps: int, start_factor: float) -> float:
    if warmup_steps <= 0 or step >= warmup_steps:
        return 1.0
    step = max(step, 0)
    return start_factor + (1.0 - start_factor) * step / warmup_steps


def warmup_lr(step: int, target_lr: float, warmup_steps: int, start_factor: float = 0.0) -> float:
    """Gradual warmup: the LR at `step`, linear from start_factor*target_lr at step 0 to
    target_lr at step `warmup_steps` (and constant after)."""
    if not 0.0 <= start_factor <= 1.0:
        raise ValueError(f"start_factor must be in [0, 1], got {start_factor}")
    return target_lr * _warmup_factor(step, warmup_steps, start_factor)


class _WarmupFactor:
    """Picklable LambdaLR factor (its state goes into the scheduler's state_dict)."""

    def __init__(self, warmup_steps: int, start_factor: float) -> None:
        self.warmup_steps = warmup_steps
        self.start_factor = start_factor

    def __call__(self, step: int) -> float:
        return _warmup_factor(step, self.warmup_steps, self.start_factor)


def linear_warmup_scheduler(optimizer: Any, warmup_steps: int, start_factor: float = 0.0) -> Any:
    """A LambdaLR that warms every param group's LR up linearly over `warmup_steps` calls of
    `scheduler.step()` (same curve as `warmup_lr`), then keeps it. Checkpoint it like any
    scheduler."""
    from torch.optim.lr_scheduler import LambdaLR

    if not 0.0 <= start_factor <= 1.0:
        raise ValueError(f"start_factor must be in [0, 1], got {start_factor}")
    return LambdaLR(optimizer, _WarmupFactor(int(warmup_steps), float(start_factor)))

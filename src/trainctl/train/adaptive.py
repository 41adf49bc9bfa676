"""Adaptive batch size: train at the global batch size that makes the most progress per
second (goodput), re-chosen as training goes, with the learning rate scaled to match.

    adaptive = AdaptiveBatch(ddp, optimizer, len(train_set), base_batch_size=64,
                             max_batch_size=1024, max_per_worker=128, seed=0)
    ckpt.restore(model=ddp, optimizer=optimizer, sampler=adaptive)   # batch, estimates, position
    for epoch in range(adaptive.epoch, epochs):
        adaptive.set_epoch(epoch)
        for step in adaptive:                       # a global batch of the current size
            for micro in step.micro_batches:        # this worker's share, in pieces
                with adaptive.accumulate(micro):    # no_sync but on the last; timed; measured
                    x, y = train_set[micro.indices]
                    (loss_fn(ddp(x), y) * micro.loss_scale).backward()
            adaptive.step()                         # optimizer step at the scaled LR; may resize
            report_step(adaptive.steps, loss=..., **adaptive.metrics())
            ckpt.save(..., sampler=adaptive)         # its state goes with the checkpoint

`base_batch_size` is the batch the learning rate (and the rest of the recipe) was tuned
for; the job starts there. Every `adapt_every` optimizer steps the batch size is re-chosen
among sizes from `base_batch_size` to `max_batch_size` (at most doubling or halving at a
time). The data order is GlobalBatchSampler's: the position is counted in samples, so every
sample is still used once per epoch whatever the sequence of batch and world sizes.

The formulas (B: global batch, B0: base batch, N: workers):

- Gradient noise scale (McCandlish, Kaplan, Amodei et al., "An Empirical Model of
  Large-Batch Training", 2018, appendix A.1): with |G_b|^2 the squared norm of a gradient
  averaged over b samples, E|G_b|^2 = |G|^2 + tr(S)/b. Two batch sizes b < B, measured in
  the same step - each worker's local gradient (b = B/N, before DDP's all-reduce, read by a
  communication hook) and the all-reduced one (B); on one worker, each micro-batch's and
  their sum - give unbiased estimates
      |G|^2 ~ (B|G_B|^2 - b|G_b|^2) / (B - b)      tr(S) ~ (|G_b|^2 - |G_B|^2) / (1/b - 1/B)
  which are smoothed separately (exponential moving averages, bias-corrected) before the
  noise scale phi = tr(S) / |G|^2 is taken, as in Pollux.
- Statistical efficiency and the AdaScale gain (Qiao et al., "Pollux: Co-adaptive Cluster
  Scheduling for Goodput-Optimized Deep Learning", OSDI 2021, section 3.1; Johnson, Agrawal,
  Gu, Guestrin, "AdaScale SGD", ICML 2020): one step at batch B makes the progress of
      r(B) = (phi/B0 + 1) / (phi/B + 1)  =  B (phi + B0) / (B0 (phi + B))
  steps at B0 (1 <= r <= B/B0), so the learning rate is multiplied by r (the gain) and the
  efficiency per sample is E(B) = r B0 / B = (phi + B0) / (phi + B).
- Throughput: a step at B on N workers is s micro-batches of m = B/(N s) samples each
  (s from max_per_worker), and takes T = s (alpha + beta m) + c_N: alpha and beta fitted by
  least squares to the measured compute time of the micro-batch sizes it has run, c_N the
  measured rest of a step (optimizer step, the exposed wait for the all-reduce, the loop).
  Until two sizes were measured a micro-batch's compute is taken as independent of its size:
  optimistic, so that a larger batch the noise scale favours is tried once and measured.
- Goodput(B) = B / T(B) * E(B): progress in base-batch samples per second. The batch that
  maximises it is taken when it is at least 5 % better than the current one's.

`progress` counts scale-invariant steps (the sum of the gains): drive an LR schedule or a
stopping rule by it and it means the same at any batch size. On one worker the estimate
needs two micro-batches a step, so each step is split at least in two, and a copy of the
gradients is kept to take each micro-batch's part. The noise scale is that of the plain
gradient (Pollux preconditions it for Adam); pass scale_lr=False to leave the learning rate
alone (e.g. with Adam, whose rule differs).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator, Sized
from typing import Any

from trainctl.train.elastic import GlobalBatchSampler, MicroBatch, Step

__all__ = ["AdaptiveBatch", "NoiseScale", "ThroughputModel", "efficiency", "gain"]

# The step timer; a test swaps in a steady clock, so that what it checks does not depend
# on how loaded the machine is.
_clock = time.perf_counter


HYSTERESIS = 1.05  # a new batch size must promise this much more goodput
MAX_FACTOR = 2.0  # and is at most this far from the current one


def gain(batch: float, base: float, noise_scale: float | None) -> float:
    """AdaScale's gain r(B) = B (phi + B0) / (B0 (phi + B)); B/B0 while phi is unknown."""
    if noise_scale is None:
        return batch / base
    return batch * (noise_scale + base) / (base * (noise_scale + batch))


def efficiency(batch: float, base: float, noise_scale: float | None) -> float:
    """Pollux's statistical efficiency per sample, E(B) = (phi + B0) / (phi + B)."""
    return gain(batch, base, noise_scale) * base / batch


class NoiseScale:
    """The gradient noise scale phi = tr(S)/|G|^2 from pairs of gradient norms (module
    docstring), each term an exponential moving average with bias correction."""

    def __init__(self, smoothing: float = 0.99) -> None:
        if not 0.0 <= smoothing < 1.0:
            raise ValueError(f"smoothing must be in [0, 1), got {smoothing!r}")
        self.smoothing = smoothing
        self._sqr = self._var = self._weight = 0.0

    def update(self, small_sqr: float, small_batch: float, big_sqr: float, big_batch: float):
        if not big_batch > small_batch > 0 or not (
            math.isfinite(small_sqr) and math.isfinite(big_sqr)
        ):
            return
        sqr = (big_batch * big_sqr - small_batch * small_sqr) / (big_batch - small_batch)
        var = (small_sqr - big_sqr) / (1 / small_batch - 1 / big_batch)
        theta = self.smoothing
        self._sqr = theta * self._sqr + (1 - theta) * sqr
        self._var = theta * self._var + (1 - theta) * var
        self._weight = theta * self._weight + (1 - theta)

    @property
    def grad_sqr(self) -> float | None:
        return self._sqr / self._weight if self._weight else None

    @property
    def grad_var(self) -> float | None:
        return self._var / self._weight if self._weight else None

    @property
    def value(self) -> float | None:
        """phi, in samples; None before the first measurement. A signal buried in noise
        (|G|^2 estimated at or below zero) reads as a very large noise scale."""
        if not self._weight:
            return None
        var = max(self._var, 0.0)
        if self._sqr <= 1e-9 * var or self._sqr <= 0:
            return 1e9
        return min(var / self._sqr, 1e9)

    def state_dict(self) -> dict[str, float]:
        return {"sqr": self._sqr, "var": self._var, "weight": self._weight}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self._sqr, self._var = float(state["sqr"]), float(state["var"])
        self._weight = float(state["weight"])


class ThroughputModel:
    """Seconds per optimizer step: s (alpha + beta m) + c_N (module docstring)."""

    def __init__(self, smoothing: float = 0.8) -> None:
        self.smoothing = smoothing
        self.compute: dict[tuple[int, float], float] = {}  # (s, m) -> seconds of compute
        self.rest: dict[int, float] = {}  # N -> seconds of the rest of a step

    def _ema(self, table: dict[Any, float], key: Any, value: float) -> None:
        old = table.get(key)
        table[key] = value if old is None else self.smoothing * old + (1 - self.smoothing) * value

    def observe(self, workers: int, accum: int, micro: float, compute: float, rest: float):
        self._ema(self.compute, (accum, round(micro, 3)), max(compute, 0.0))
        self._ema(self.rest, workers, max(rest, 0.0))

    def fit(self) -> tuple[float, float] | None:
        """(alpha, beta) by least squares, non-negative; None before any measurement."""
        rows = [(s, s * m, t) for (s, m), t in self.compute.items()]
        if not rows:
            return None
        per_micro = sum(t for _, _, t in rows) / sum(s for s, _, _ in rows)
        if len({m for _, m in self.compute}) == 1:
            # One micro-batch size seen: its compute is taken as independent of the size -
            # optimistic, so a larger batch the noise scale favours is tried and measured.
            return per_micro, 0.0
        a11 = sum(s * s for s, _, _ in rows)
        a12 = sum(s * sm for s, sm, _ in rows)
        a22 = sum(sm * sm for _, sm, _ in rows)
        b1 = sum(s * t for s, _, t in rows)
        b2 = sum(sm * t for _, sm, t in rows)
        det = a11 * a22 - a12 * a12
        alpha = (a22 * b1 - a12 * b2) / det if det > 0 else -1.0
        beta = (a11 * b2 - a12 * b1) / det if det > 0 else -1.0
        if alpha >= 0 and beta >= 0:
            return alpha, beta
        if alpha < 0 <= b2:  # all of it per sample
            return 0.0, b2 / a22
        return per_micro, 0.0  # timing noise hides any dependence on the size

    def rest_seconds(self, workers: int) -> float:
        if workers in self.rest:
            return self.rest[workers]
        if not self.rest:
            return 0.0
        nearest = min(self.rest, key=lambda n: (abs(n - workers), -n))
        return self.rest[nearest]

    def step_seconds(self, workers: int, accum: int, micro: float) -> float | None:
        fitted = self.fit()
        if fitted is None:
            return None
        alpha, beta = fitted
        return accum * (alpha + beta * micro) + self.rest_seconds(workers)

    def state_dict(self) -> dict[str, Any]:
        return {
            "compute": [[s, m, t] for (s, m), t in self.compute.items()],
            "rest": {str(n): t for n, t in self.rest.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.compute = {(int(s), float(m)): float(t) for s, m, t in state["compute"]}
        self.rest = {int(n): float(t) for n, t in state["rest"].items()}


class AdaptiveBatch:
    """See the module docstring. `model` is the DDP-wrapped model when the world size is
    above one (its communication hook measures each worker's gradient), the plain model
    otherwise."""

    def __init__(
        self,
        model: Any,
        optimizer: Any,
        dataset_or_len: Sized | int,
        *,
        base_batch_size: int,
        max_batch_size: int,
        max_per_worker: int | None = None,
        seed: int = 0,
        shuffle: bool = True,
        adapt_every: int = 50,
        smoothing: float = 0.99,
        scale_lr: bool = True,
        num_replicas: int | None = None,
        rank: int | None = None,
    ) -> None:
        for name, value in (("base_batch_size", base_batch_size), ("adapt_every", adapt_every)):
            if int(value) != value or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if int(max_batch_size) != max_batch_size or max_batch_size < base_batch_size:
            raise ValueError(
                f"max_batch_size must be an integer of at least base_batch_size "
                f"({base_batch_size}), got {max_batch_size!r}"
            )
        if max_per_worker is not None and (
            int(max_per_worker) != max_per_worker or max_per_worker < 1
        ):
            raise ValueError(f"max_per_worker must be a positive integer, got {max_per_worker!r}")
        self.sampler = GlobalBatchSampler(
            dataset_or_len,
            base_batch_size,
            max_per_worker=max_per_worker,
            seed=seed,
            shuffle=shuffle,
            num_replicas=num_replicas,
            rank=rank,
        )
        self.world = self.sampler.num_replicas
        # One worker: each step in at least two micro-batches, the smaller batch of the pair.
        self.min_accum = 2 if self.world == 1 else 1
        self.sampler.set_global_batch_size(base_batch_size, min_accum=self.min_accum)
        self.model, self.optimizer = model, optimizer
        # the trained parameters, and whether they are on a GPU (timing must synchronize)
        self._params = [p for p in model.parameters() if p.requires_grad]
        self._cuda = any(p.is_cuda for p in self._params[:1])
        self.base_batch_size, self.max_batch_size = int(base_batch_size), int(max_batch_size)
        self.adapt_every, self.scale_lr = int(adapt_every), scale_lr
        self.noise = NoiseScale(smoothing)
        self.throughput = ThroughputModel()
        self.progress = 0.0  # scale-invariant steps: the sum of the gains
        self.steps = 0  # optimizer steps taken (all attempts)
        self.history: list[tuple[int, int]] = [(0, self.base_batch_size)]  # (step, batch)
        self._step: Step | None = None
        self._started = 0.0
        self._compute = 0.0
        self._last_update_seconds = 0.0
        self._micro_sqr: list[tuple[float, int]] = []  # one worker: (|g_micro|^2, samples)
        self._hooked = None
        if self.world > 1:
            from torch.nn.parallel import DistributedDataParallel

            if not isinstance(model, DistributedDataParallel):
                raise ValueError(
                    "model must be the DistributedDataParallel-wrapped model when the world "
                    f"size is {self.world}: AdaptiveBatch reads each worker's gradient from "
                    "its communication hook"
                )
            # per bucket: squared norms (on the gradients' device), and when each bucket's
            # all-reduce was started and finished (the exposed part is a step's, not a sample's)
            self._hooked = {"local": [], "global": [], "started": [], "finished": []}
            model.register_comm_hook(self._hooked, _measuring_allreduce)

    # -- the sampler's surface ---------------------------------------------------------------
    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    @property
    def global_batch_size(self) -> int:
        return self.sampler.global_batch_size

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[Step]:
        for step in self.sampler:  # reads the batch size afresh at each step
            self._begin(step)
            yield step

    def _begin(self, step: Step) -> None:
        self._step, self._started, self._compute = step, _clock(), 0.0
        self._micro_sqr = []
        if self._hooked is not None:
            for values in self._hooked.values():
                values.clear()

    # -- one micro-batch -------------------------------------------------------------------
    @contextlib.contextmanager
    def accumulate(self, micro: MicroBatch) -> Iterator[None]:
        """Around one micro-batch's forward and backward: skips DDP's all-reduce on all but
        the step's last micro-batch, times it, and on one worker measures its gradient."""
        before = None
        if self.world == 1 and self._step is not None and len(self._step.micro_batches) > 1:
            before = [None if p.grad is None else p.grad.detach().clone() for p in self._params]
        sync = (
            self.model.no_sync()
            if self._hooked is not None and not micro.last
            else contextlib.nullcontext()
        )
        started = _clock()
        with sync:
            yield
        self._synchronize()
        self._compute += _clock() - started
        if before is not None:
            sqr = 0.0
            for p, old in zip(self._params, before, strict=True):
                if p.grad is not None:
                    part = p.grad.detach() if old is None else p.grad.detach() - old
                    sqr += float(part.double().pow(2).sum())
            # the increment is loss_scale * (the micro-batch's mean gradient)
            self._micro_sqr.append((sqr / micro.loss_scale**2, len(micro.indices)))

    def _synchronize(self) -> None:
        if self._cuda:
            import torch

            torch.cuda.synchronize()

    # -- the optimizer step ----------------------------------------------------------------
    def step(self) -> None:
        """The optimizer step at the gain-scaled learning rate, then zero_grad and advance
        the sampler; every `adapt_every` steps the batch size is re-chosen. All workers
        call it."""
        step = self._step
        if step is None:
            raise RuntimeError("AdaptiveBatch.step() outside an iteration over the batches")
        batch = step.global_size
        small_sqr, small_batch, big_sqr = self._norms(step)
        compute = self._compute
        if self._hooked is not None and self._hooked["finished"]:
            # waiting for the all-reduce at the end of the backward pass: per step
            waited = max(self._hooked["finished"]) - max(self._hooked["started"])
            compute -= min(max(waited, 0.0), compute)
        rest = _clock() - self._started - compute + self._last_update_seconds
        small_sqr, compute, rest = self._agree([small_sqr, compute, rest])
        if small_batch:
            self.noise.update(small_sqr, small_batch, big_sqr, batch)
        micro_sizes = [len(m.indices) for m in step.micro_batches]
        self.throughput.observe(
            self.world, len(micro_sizes), sum(micro_sizes) / len(micro_sizes), compute, rest
        )

        updating = _clock()
        r = gain(batch, self.base_batch_size, self.noise.value)
        saved = [group["lr"] for group in self.optimizer.param_groups]
        if self.scale_lr:
            for group in self.optimizer.param_groups:
                group["lr"] = group["lr"] * r
        try:
            self.optimizer.step()
        finally:
            for group, lr in zip(self.optimizer.param_groups, saved, strict=True):
                group["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        self.sampler.advance(step)
        self.progress += r
        self.steps += 1
        self._step = None
        if self.steps % self.adapt_every == 0:
            self._adapt()
        self._last_update_seconds = _clock() - updating

    def _norms(self, step: Step) -> tuple[float, float, float]:
        """(mean |G_small|^2, small batch, |G_big|^2) of this step; small batch 0: none."""
        if self._hooked is not None:
            share = sum(len(m.indices) for m in step.micro_batches)
            # the local sum is (N b / B) * the local mean gradient (loss scales of its shares)
            rescale = step.global_size / (self.world * share)
            local = sum(float(v) for v in self._hooked["local"]) * rescale**2
            big = sum(float(v) for v in self._hooked["global"])
            return local, step.global_size / self.world, big
        if len(self._micro_sqr) < 2:
            return 0.0, 0.0, 0.0
        big = sum(
            float(p.grad.detach().double().pow(2).sum()) for p in self._params if p.grad is not None
        )
        small = sum(s for s, _ in self._micro_sqr) / len(self._micro_sqr)
        samples = sum(n for _, n in self._micro_sqr) / len(self._micro_sqr)
        return small, samples, big

    def _agree(self, values: list[float]) -> list[float]:
        """The workers' mean of each value: every worker then decides the same."""
        if self.world == 1:
            return values
        import torch
        import torch.distributed as dist

        tensor = torch.tensor(values, dtype=torch.float64)
        if dist.get_backend() == "nccl":
            tensor = tensor.cuda()
        dist.all_reduce(tensor)
        return [v / self.world for v in tensor.cpu().tolist()]

    # -- choosing the batch size -------------------------------------------------------------
    def candidates(self) -> list[int]:
        """Sizes from the base to the maximum, four per doubling."""
        sizes, k = set(), 0
        while True:
            size = round(self.base_batch_size * 2 ** (k / 4))
            if size >= self.max_batch_size:
                break
            sizes.add(max(size, self.world))
            k += 1
        sizes.add(self.max_batch_size)
        return sorted(sizes)

    def predicted_goodput(self, batch: int, noise_scale: float | None = None) -> float | None:
        """Base-batch samples per second at `batch` on the current workers."""
        phi = self.noise.value if noise_scale is None else noise_scale
        share = batch / self.world
        per = self.sampler.max_per_worker
        accum = max(self.min_accum, 1 if per is None else math.ceil(share / per))
        accum = min(accum, max(1, math.floor(share)))
        seconds = self.throughput.step_seconds(self.world, accum, share / accum)
        if seconds is None or seconds <= 0 or phi is None:
            return None
        return batch / seconds * efficiency(batch, self.base_batch_size, phi)

    def best_batch_size(self, noise_scale: float | None = None) -> int:
        """The candidate of most goodput within a factor of two of the current size, if it
        beats the current one's by 5 %; else the current size."""
        current = self.global_batch_size
        now = self.predicted_goodput(current, noise_scale)
        if now is None:
            return current
        best, best_goodput = current, now
        for size in self.candidates():
            if not current / MAX_FACTOR <= size <= current * MAX_FACTOR:
                continue
            goodput = self.predicted_goodput(size, noise_scale)
            if goodput is not None and goodput > best_goodput:
                best, best_goodput = size, goodput
        return best if best_goodput >= HYSTERESIS * now else current

    def _adapt(self) -> None:
        size = self.best_batch_size()
        if size != self.global_batch_size:
            self._resize(size)

    def _resize(self, size: int) -> None:
        self.sampler.set_global_batch_size(size, min_accum=self.min_accum)
        self.history.append((self.steps, size))
        del self.history[:-100]

    # -- what to report and checkpoint ----------------------------------------------------
    @property
    def gain(self) -> float:
        return gain(self.global_batch_size, self.base_batch_size, self.noise.value)

    def metrics(self) -> dict[str, float]:
        """For report_step: batch size, noise scale, gain and progress."""
        out = {
            "batch_size": float(self.global_batch_size),
            "gain": self.gain,
            "progress": self.progress,
        }
        if self.noise.value is not None:
            out["noise_scale"] = self.noise.value
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "version": 1,
            "sampler": self.sampler.state_dict(),
            "base_batch_size": self.base_batch_size,
            "noise": self.noise.state_dict(),
            "throughput": self.throughput.state_dict(),
            "progress": self.progress,
            "steps": self.steps,
            "history": [list(h) for h in self.history],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where the checkpoint was: batch size, noise scale, throughput
        measurements, progress and the sampler's position (at any world size)."""
        if int(state.get("base_batch_size", self.base_batch_size)) != self.base_batch_size:
            raise ValueError(
                f"the checkpoint was trained with base_batch_size {state['base_batch_size']},"
                f" not {self.base_batch_size}"
            )
        size = int(state["sampler"]["global_batch_size"])
        self.sampler.set_global_batch_size(max(size, self.world), min_accum=self.min_accum)
        self.sampler.load_state_dict(
            {**state["sampler"], "global_batch_size": self.global_batch_size}
        )
        self.noise.load_state_dict(state["noise"])
        self.throughput.load_state_dict(state["throughput"])
        self.progress, self.steps = float(state["progress"]), int(state["steps"])
        self.history = [(int(a), int(b)) for a, b in state.get("history", [])]

    def __repr__(self) -> str:
        phi = self.noise.value
        return (
            f"AdaptiveBatch(batch={self.global_batch_size}, base={self.base_batch_size}, "
            f"max={self.max_batch_size}, noise_scale={'?' if phi is None else f'{phi:.4g}'}, "
            f"gain={self.gain:.3g}, steps={self.steps}, world={self.world})"
        )


def _measuring_allreduce(state, bucket):  # type: ignore[no-untyped-def]
    """DDP communication hook: the default averaging all-reduce, adding up the squared norm
    of the local gradient before it and of the averaged one after. (Unannotated: DDP accepts
    a hook's `bucket` annotated as dist.GradBucket or not at all.)"""
    import torch
    import torch.distributed as dist

    buffer = bucket.buffer()
    state["started"].append(_clock())
    state["local"].append(torch.dot(buffer, buffer))
    world = dist.get_world_size()
    future = dist.all_reduce(buffer.div_(world), async_op=True).get_future()

    def reduced(fut: Any) -> Any:
        out = fut.value()[0]
        state["global"].append(torch.dot(out, out))
        state["finished"].append(_clock())
        return out

    return future.then(reduced)

"""What `trainctl diagnose` measures inside a training script, and the loader wrapper
that lets it substitute synthetic data.

    for xb, yb in batches(loader):   # the loader's batches, their wait timed
        ...
        report_step(step)            # under diagnose: counts measured steps, then stops

Everything here is inert unless the diagnose run sets DIAGNOSE_STEPS in the environment:
`batches` then only passes the loader's batches through. Under a diagnose run:

- steps are counted by the step number `report_step` is given, not by its calls: a
  script that reports a step twice (rank 0 again at an epoch's end, with its accuracy)
  counts it once, so every rank that reports each step ends at the same one;
- the first DIAGNOSE_WARMUP steps are a warm-up (start-up, first iterations, allocator
  growth) and are not measured;
- the next DIAGNOSE_STEPS steps are: wall time, the time spent waiting for the next batch
  in `batches` (data loading), the samples of each batch, and the time `Checkpointer.save`
  held the loop (and its background write took);
- then rank 0 sends a `diagnosis` control message with those numbers and each rank that
  reached the step ends the process (exit 0). Ranks that report less (rank 0 only, or
  some steps only) cannot all end together that way: the controller stops what is still
  running a few seconds after the message (trainctl.controller), so no run waits in a
  collective for a peer that has gone;
- with SYNTHETIC_DATA=1, `batches` yields the loader's first batch again and again (as
  many batches per epoch as the loader has): no reading, decoding or collating, which is
  how the run without data loading is made.
"""

from __future__ import annotations

import atexit
import os
import time
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from trainctl import protocol

__all__ = ["batches"]

DIAGNOSE_STEPS = "TRAINCTL_DIAGNOSE_STEPS"
DIAGNOSE_WARMUP = "TRAINCTL_DIAGNOSE_WARMUP"
SYNTHETIC_DATA = "TRAINCTL_SYNTHETIC_DATA"

T = TypeVar("T")


class _Meter:
    """The current diagnose run's counters (one per process)."""

    def __init__(self, steps: int, warmup: int, synthetic: bool) -> None:
        self.steps = steps
        self.warmup = warmup
        self.synthetic = synthetic  # `batches` repeats the first batch
        self.first_batch: Any = None  # (synthetic data) the batch repeated
        # (synthetic data) the first epoch's batch sizes, for every epoch: a resumable
        # sampler that never runs (nothing is drawn from it) would not say how long the
        # next one is; None for a loader without a length
        self.epoch_sizes: list[int] | None = None
        self.calls = 0  # distinct steps reported (a step reported again is not counted)
        self.step_seen: int | None = None  # the step number reported last
        self.started: float | None = None  # when the warm-up ended
        self.used_batches = False  # the script draws its data through `batches`
        self.data_wait = 0.0
        self.samples = 0
        self.samples_known = True
        self.saves = 0
        self.checkpoint_stall = 0.0
        self.checkpoint_write = 0.0
        self.last_step = 0
        self.last_at: float | None = None  # the last step's end
        self.reported = False

    @property
    def measuring(self) -> bool:
        return self.started is not None


_meter: _Meter | None = None
_meter_read = False


def _active() -> _Meter | None:
    """The meter of a diagnose run, made on first use; None outside one."""
    global _meter, _meter_read
    if not _meter_read:
        _meter_read = True
        steps = int(os.environ.get(DIAGNOSE_STEPS, "0") or 0)
        if steps > 0:
            warmup = int(os.environ.get(DIAGNOSE_WARMUP, "5") or 0)
            _meter = _Meter(steps, warmup, os.environ.get(SYNTHETIC_DATA) == "1")
            atexit.register(report_early_end)
    return _meter


def batches(loader: Iterable[T]) -> Iterator[T]:
    """The loader's batches (one epoch: call it again for the next, as with the loader).

    Outside a diagnose run it passes them through, and under trainctl rank 0 tells the
    controller how long its loop has waited for them (the job's data loading, in its
    goodput: `trainctl status`). In a diagnose run it times how long the loop waits for each
    batch; with synthetic data it repeats the first batch instead of loading more."""
    meter = _active()
    if meter is None:
        from trainctl.train.context import _global_rank

        if not protocol.under_trainctl() or _global_rank() != 0:
            yield from loader
        else:
            yield from _timed(loader)
        return
    meter.used_batches = True
    if meter.synthetic:
        yield from _repeat_first(loader, meter)
        return
    for batch, waited in _waits(loader):
        if meter.measuring:
            meter.data_wait += waited
            _count(meter, batch)
        yield batch


def _waits(loader: Iterable[T]) -> Iterator[tuple[T, float]]:
    """Each batch, with the seconds the loop waited for it."""
    it = iter(loader)
    while True:
        began = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            return
        yield batch, time.perf_counter() - began


# Rank 0's wait for batches so far in this process, and when it was last sent: at most every
# DATA_WAIT_REPORT_SECONDS (and as the process ends), as a running total.
DATA_WAIT_REPORT_SECONDS = 10.0
_data_wait = {"seconds": 0.0, "sent": 0.0, "sent_at": 0.0}


def _timed(loader: Iterable[T]) -> Iterator[T]:
    from trainctl.train import _background

    _background.at_end(_send_data_wait)
    for batch, waited in _waits(loader):
        _data_wait["seconds"] += waited
        if time.monotonic() - _data_wait["sent_at"] >= DATA_WAIT_REPORT_SECONDS:
            _send_data_wait()
        yield batch


def _send_data_wait() -> None:
    if _data_wait["seconds"] != _data_wait["sent"]:
        _data_wait["sent"] = _data_wait["seconds"]
        _data_wait["sent_at"] = time.monotonic()
        protocol.send("data_wait", seconds=round(_data_wait["seconds"], 4))


def _repeat_first(loader: Iterable[T], meter: _Meter) -> Iterator[T]:
    if meter.first_batch is None:
        meter.epoch_sizes = _batch_sizes(loader)
        for batch in loader:
            meter.first_batch = batch
            break
        else:
            return  # an empty loader: nothing to repeat
    # (no length: an endless epoch, which the diagnose run stops)
    sizes: Iterable[int] = meter.epoch_sizes if meter.epoch_sizes is not None else iter(int, 1)
    for size in sizes:
        batch = meter.first_batch if size <= 0 else _take(meter.first_batch, size)
        if meter.measuring:
            _count(meter, batch)
        yield batch


def _batch_sizes(loader: Any) -> list[int] | None:
    """How many samples each batch of an epoch has: a torch DataLoader's last batch can be
    short, and a sampler that counts what it handed out must see the same numbers. Zeros
    where the size is unknown (the first batch's is used); None for a loader without a
    length."""
    try:
        count = len(loader)
    except TypeError:
        return None
    batch_size = getattr(loader, "batch_size", None)
    sampler = getattr(loader, "sampler", None)
    try:
        samples = len(sampler) if sampler is not None else None
    except TypeError:
        samples = None
    if not isinstance(batch_size, int) or samples is None or count == 0:
        return [0] * count
    sizes = [batch_size] * (samples // batch_size)
    if samples % batch_size and not getattr(loader, "drop_last", False):
        sizes.append(samples % batch_size)
    return sizes


def _take(batch: Any, size: int) -> Any:
    """The first `size` samples of a batch (tensors and arrays sliced on their first
    dimension, inside tuples, lists and dicts)."""
    if isinstance(batch, dict):
        return {k: _take(v, size) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_take(v, size) for v in batch)
    if getattr(batch, "shape", None) is not None and len(batch.shape) > 0:
        return batch[:size]
    return batch


def _count(meter: _Meter, batch: Any) -> None:
    size = _batch_size(batch)
    if size is None:
        meter.samples_known = False
    else:
        meter.samples += size


def _batch_size(batch: Any) -> int | None:
    """The number of samples in a batch: the first dimension of its first tensor."""
    if isinstance(batch, dict):
        batch = next(iter(batch.values()), None)
    elif isinstance(batch, (list, tuple)) and batch:
        batch = batch[0]
    shape = getattr(batch, "shape", None)
    if shape is not None and len(shape) > 0:
        return int(shape[0])
    return None


def checkpoint_saved(stall: float) -> None:
    """`Checkpointer.save` held the loop for `stall` seconds."""
    meter = _active()
    if meter is not None and meter.measuring:
        meter.saves += 1
        meter.checkpoint_stall += stall


def checkpoint_written(seconds: float) -> None:
    """A checkpoint's write (in the background with async_save) took `seconds`."""
    meter = _active()
    if meter is not None and meter.measuring:
        meter.checkpoint_write += seconds


def on_step(step: int, rank: int) -> bool:
    """Called by `report_step` on every rank: count each new step; True once the run is
    measured (the caller then ends the process)."""
    meter = _active()
    if meter is None or meter.reported:
        return False
    if meter.step_seen is not None and int(step) == meter.step_seen:
        return False  # the same step again (an epoch's end, another metric): counted once
    meter.step_seen = int(step)
    meter.calls += 1
    meter.last_at = time.perf_counter()
    if meter.started is None:
        if meter.calls > meter.warmup:
            meter.started = meter.last_at  # this step's end starts the measured window
        return False
    meter.last_step = int(step)
    if meter.calls < meter.warmup + 1 + meter.steps:
        return False
    if rank == 0:
        from trainctl.train.context import _world_size

        protocol.send("diagnosis", **_report(meter, _world_size()))
    meter.reported = True
    return True


def report_early_end() -> None:
    """The script ends (its epochs are done) before the steps asked for: report the steps
    measured so far (from `finish`, or at exit for a script that does not call it)."""
    meter = _meter
    if meter is None or meter.reported or not meter.measuring or meter.calls <= meter.warmup + 1:
        return
    meter.reported = True
    from trainctl.train.context import _global_rank, _world_size

    if _global_rank() == 0:
        protocol.send("diagnosis", **_report(meter, _world_size(), ended_early=True))


def _report(meter: _Meter, world: int, *, ended_early: bool = False) -> dict[str, Any]:
    assert meter.started is not None
    seconds = (meter.last_at or time.perf_counter()) - meter.started
    return {
        "step": meter.last_step,
        "steps": meter.calls - meter.warmup - 1,
        "ended_early": ended_early,
        "seconds": round(seconds, 6),
        "world": world,
        "synthetic": meter.synthetic,
        # None: not measured (the script draws its data without `batches`)
        "data_wait": round(meter.data_wait, 6) if meter.used_batches else None,
        "samples": meter.samples if meter.used_batches and meter.samples_known else None,
        "saves": meter.saves,
        "checkpoint_stall": round(meter.checkpoint_stall, 6),
        "checkpoint_write": round(meter.checkpoint_write, 6),
        "notice_handler": _notice_handler(),
    }


def _notice_handler() -> str | None:
    """Who handles SIGTERM, the interruption notice, in this process: "trainctl" (a
    PreemptionFlag: the script checkpoints at the notice), "script" (a handler of its own,
    which may or may not save), or None (the notice ends it: work since its last
    checkpoint is lost)."""
    import signal

    handler = signal.getsignal(signal.SIGTERM)
    # told by its class's module, not imported: preemption reaches this module (finish)
    owner = type(getattr(handler, "__self__", None))
    if (owner.__module__, owner.__name__) == ("trainctl.train.preemption", "PreemptionFlag"):
        return "trainctl"
    if callable(handler):
        return "script"
    return None

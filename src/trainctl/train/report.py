"""Progress reports for the trainctl controller.

    for batch in loader:
        ...
        step += 1
        report_step(step)      # cheap: rank 0 only, at most one message every 0.5 s
                               # (the last step held back is sent as the process ends)
        report_step(step, loss=loss.item(), lr=lr)   # with metrics: every call is sent

        report_step(step, total_steps=epochs * len(loader))   # the work: progress, time
                               # left and the spot deadline policy (or the total_steps field)

The controller uses the last reported step to measure how many steps an interruption cost;
metrics go into the job's metric history (`trainctl metrics JOB`, `job.metrics()`).
Outside trainctl (no TRAINCTL_JOB in the environment) this does nothing.
"""

from __future__ import annotations

import time

from trainctl import protocol
from trainctl.train import _background, diagnosis

__all__ = ["report_step"]

MIN_INTERVAL = 0.5

_last_sent: float | None = None
# The last step the throttle held back: sent as the process ends (flush_step), so a job's
# record ends at the step its script reached, not up to MIN_INTERVAL before it.
_unsent: int | None = None
# The job's training steps in all, once the script said it (report_step(total_steps=N)).
_total_steps: int | None = None


def report_step(
    step: int,
    *,
    total_steps: int | None = None,
    min_interval: float = MIN_INTERVAL,
    total: int | None = None,
    **metrics: float,
) -> None:
    """Send `{"event": "step", "step": step}` from global rank 0, throttled to `min_interval`.

    Call it on every rank, once per optimizer step: under `trainctl diagnose` it counts
    the measured steps and ends the run (see trainctl.train.diagnosis).

    The first call always sends; a step the throttle held back is sent when the process
    ends (or calls `finish()`), so the record ends at the step reached. `Checkpointer.save`
    reports its step unthrottled. With
    `metrics` (numbers: loss=0.31, acc=0.9) every call is sent, so no value is lost; the
    controller thins a metric's history once it is long (see trainctl.metrics).

    `total_steps`: the job's steps in all (the job field of that name, said by the script):
    progress, time left and the spot deadline policy. `total` is its earlier spelling, still
    taken.
    """
    if not protocol.under_trainctl():
        return
    from trainctl.train.context import _global_rank

    global _total_steps
    total_steps = total if total_steps is None else total_steps
    if total_steps is not None and int(total_steps) >= 1:
        _total_steps = int(total_steps)
    rank = _global_rank()
    if rank == 0:
        _send(step, min_interval, metrics)
    if diagnosis.on_step(step, rank):  # a `trainctl diagnose` run, measured
        from trainctl.train.finish import finish

        finish(0)


def _send(step: int, min_interval: float, metrics: dict[str, float]) -> None:
    if metrics:
        _emit(int(step), metrics={k: float(v) for k, v in metrics.items()})
        return
    if _last_sent is not None and time.monotonic() - _last_sent < min_interval:
        _hold(int(step))
        return
    _emit(int(step))


def _emit(step: int, **fields: object) -> None:
    """Send a step now: it restarts the throttle interval and supersedes a held step."""
    global _last_sent, _unsent
    _last_sent = time.monotonic()
    _unsent = None
    if _total_steps is not None:  # the work (trainctl.controller.deadline): with each step
        fields = {"total_steps": _total_steps, **fields}
    protocol.send("step", step=step, **fields)


def _hold(step: int) -> None:
    global _unsent
    if _unsent is None:
        _background.at_end(flush_step)  # (registered once, however often called)
    _unsent = step


def flush_step() -> None:
    """Send the step the throttle last held back, if any (as the process ends)."""
    if _unsent is not None:
        _emit(_unsent)


def _report_now(step: int) -> None:
    """Unthrottled (rank 0 callers only): also restarts the throttle interval."""
    if protocol.under_trainctl():
        _emit(int(step))
